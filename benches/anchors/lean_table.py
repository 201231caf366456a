import sys, collections, statistics as st
# lean_table.py PREFIX [PREFIX...]: lean tables of lean_table.sh windows. Per side and row: each run's
# statistic (median / min of its ITERS calls; oneDNN: the better layout, ours: the best lean algorithm),
# then the better of the two runs (the lower median / the lower min), the same rule on both sides.
lean={'fwd':['fwd/convgemm','fwd/direct'],'bwd_data':['bwd-data/deconvgemm','bwd-data/flipped-convgemm','bwd-data/flipped-direct'],'bwd_weight':['bwd-filter/convgemm-trans','bwd-filter/direct']}
def load(pre):
    # oneDNN: runs[(layer)] -> list of dict pass -> (med, min) best layout
    one=collections.defaultdict(list); cur=None
    for line in open(pre+'.onednn'):
        if line.startswith('## '): cur=line.split()[1]; one[cur].append({}); continue
        p=line.split()
        if cur and len(p)>=8 and p[1] in('nchw','nhwc'):
            try: med,mn=float(p[4]),float(p[5])
            except: continue
            r=one[cur][-1]; o=r.get(p[3],(1e9,1e9)); r[p[3]]=(min(o[0],med),min(o[1],mn))
    pr=collections.defaultdict(list); order=[]
    for line in open(pre+'.probe'):
        if line.startswith('## '):
            cur=line.split()[1]; pr[cur].append({})
            if cur not in order: order.append(cur)
            continue
        p=line.split()
        if cur and len(p)>=7 and p[2]=='ms': pr[cur][-1][p[0]]=(float(p[6]),float(p[1]))
    return one,pr,order
W=[load(p) for p in sys.argv[1:]]
order=W[0][2]
b=lambda x: f"**{x:.2f}**" if x<=1.1 else f"{x:.2f}"
print('| layer | pass | lean algo | oneDNN median ms | lean median ms | lean / oneDNN (median) | lean / oneDNN (min) |')
print('| --- | --- | --- | --- | --- | --- | --- |')
cnt={'med':[0]*len(W),'min':[0]*len(W)}; over={'med':[[] for _ in W],'min':[[] for _ in W]}; tot=0
for l in order:
    for ps in ['fwd','bwd_data','bwd_weight']:
        tot+=1; cells={'o':[],'v':[],'rm':[],'rn':[],'a':[]}
        for i,(one,pr,_) in enumerate(W):
            om=min(r[ps][0] for r in one[l]); on=min(r[ps][1] for r in one[l])
            # ours: per run the best lean algo's median; the algo chosen by the mean over runs
            cand=[a for a in lean[ps] if all(a in r for r in pr[l])]
            algo=min(cand, key=lambda a: min(r[a][0] for r in pr[l]))
            vm=min(r[algo][0] for r in pr[l]); vn=min(r[a][1] for r in pr[l] for a in cand)
            cells['o'].append(f"{om:.2f}"); cells['v'].append(f"{vm:.2f}"); cells['a'].append(algo.split('/')[1])
            for s,r in (('med',vm/om),('min',vn/on)):
                if r<=1.1: cnt[s][i]+=1
                else: over[s][i].append(f"{l} {ps} {r:.3f}")
            cells['rm'].append(b(vm/om)); cells['rn'].append(b(vn/on))
        al=cells['a'][0] if len(set(cells['a']))==1 else ' / '.join(cells['a'])
        print(f"| {l} | {ps} | {al} | {' / '.join(cells['o'])} | {' / '.join(cells['v'])} | {' / '.join(cells['rm'])} | {' / '.join(cells['rn'])} |")
for s in ('med','min'):
    print(f"\n{s}: lean <= 1.1x: "+' / '.join(str(c) for c in cnt[s])+f" of {tot}")
    for i in range(len(W)):
        if over[s][i]: print(f"  w{i+1} over: "+', '.join(over[s][i]))
