//! `CORE_BLAS_HUGEPAGES=0` turns off `AlignedVec`'s huge-page storage: the test runs its own
//! binary again with the variable set (it is read once per process) and checks the child's view.

use core_blas::AlignedVec;

/// What this process does with a buffer at the threshold; run directly it checks whatever mode the
/// environment gives, run by `off_switch` it prints the mode for the parent.
#[test]
fn child_reports_mode() {
    let off = std::env::var("CORE_BLAS_HUGEPAGES").is_ok_and(|v| v.trim() == "0");
    let on = cfg!(target_os = "linux") && !off;
    assert_eq!(AlignedVec::huge_pages().is_some(), on);
    let len = AlignedVec::huge_pages().unwrap_or(4 << 20).max(64) / 4;
    let v = AlignedVec::zeroed(len);
    assert_eq!(v.is_huge(), on);
    assert_eq!(v.as_ptr() as usize % 64, 0);
    if on {
        assert_eq!(v.as_ptr() as usize % (2 << 20), 0);
    }
    assert!(v.iter().all(|&x| x == 0.0));
    println!("hugepages-mode={}", if on { "on" } else { "off" });
}

#[test]
fn off_switch() {
    let exe = std::env::current_exe().expect("test binary path");
    for (value, want) in [
        ("0", "off"),
        (
            "1",
            if cfg!(target_os = "linux") {
                "on"
            } else {
                "off"
            },
        ),
    ] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "child_reports_mode",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CORE_BLAS_HUGEPAGES", value)
            .output()
            .expect("run the test binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "CORE_BLAS_HUGEPAGES={value}: {stdout}"
        );
        assert!(
            stdout.contains(&format!("hugepages-mode={want}")),
            "CORE_BLAS_HUGEPAGES={value}: {stdout}"
        );
    }
}
