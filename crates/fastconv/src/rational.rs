//! Exact rational arithmetic for transform synthesis: interpolation points and polynomials over ℚ.
//!
//! Everything here is exact (`BigRational`, arbitrary precision), so a synthesized transform is
//! either exactly right or rejected; rounding to `f32`/`f64` happens only when a transform is
//! exported for execution.

use std::fmt;

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use crate::error::{FastconvError, Result};

/// Builds the exact rational `num / den`, rejecting a zero denominator.
pub fn ratio(num: i64, den: i64) -> Result<BigRational> {
    if den == 0 {
        return Err(FastconvError::ZeroDenominator { num, den });
    }
    Ok(BigRational::new(BigInt::from(num), BigInt::from(den)))
}

/// Rounds an exact rational to the nearest `f64` (num-rational's conversion, correctly rounded
/// for the small rationals transforms contain).
pub fn to_f64(q: &BigRational) -> f64 {
    // A BigRational always converts (it saturates to ±inf for huge values), so NaN is unreachable.
    q.to_f64().unwrap_or(f64::NAN)
}

/// An interpolation point of the Cook-Toom construction: a finite rational `a` (modulus `x - a`
/// of the CRT) or the point at infinity (the leading coefficient of the product polynomial).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Point {
    /// A finite point `a`.
    Finite(BigRational),
    /// The point at infinity.
    Infinity,
}

impl Point {
    /// The finite point `num / den`; `Err` naming the point when `den == 0`.
    pub fn ratio(num: i64, den: i64) -> Result<Self> {
        ratio(num, den).map(Point::Finite)
    }

    /// The finite integer point `a`.
    pub fn int(a: i64) -> Self {
        Point::Finite(BigRational::from_integer(BigInt::from(a)))
    }

    /// Whether this is the point at infinity.
    pub fn is_infinite(&self) -> bool {
        matches!(self, Point::Infinity)
    }

    /// The point as `f64` (`f64::INFINITY` for the point at infinity).
    pub fn to_f64(&self) -> f64 {
        match self {
            Point::Finite(a) => to_f64(a),
            Point::Infinity => f64::INFINITY,
        }
    }
}

impl From<i64> for Point {
    fn from(a: i64) -> Self {
        Point::int(a)
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Point::Finite(a) => write!(f, "{a}"),
            Point::Infinity => write!(f, "inf"),
        }
    }
}

/// A polynomial over ℚ, coefficients from the constant term up (`coeffs[i]` multiplies `x^i`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poly {
    coeffs: Vec<BigRational>,
}

impl Poly {
    /// The constant polynomial 1.
    pub fn one() -> Self {
        Poly {
            coeffs: vec![BigRational::one()],
        }
    }

    /// The monic linear polynomial `x - a`: the CRT modulus of the finite point `a`.
    pub fn linear_root(a: &BigRational) -> Self {
        Poly {
            coeffs: vec![-a.clone(), BigRational::one()],
        }
    }

    /// The product `Π (x - a)` over the given roots.
    pub fn from_roots<'a>(roots: impl IntoIterator<Item = &'a BigRational>) -> Self {
        roots
            .into_iter()
            .fold(Poly::one(), |p, a| p.mul(&Poly::linear_root(a)))
    }

    /// Degree (0 for constants, including the zero polynomial).
    pub fn degree(&self) -> usize {
        self.coeffs.iter().rposition(|c| !c.is_zero()).unwrap_or(0)
    }

    /// Coefficient of `x^i` (zero beyond the stored length).
    pub fn coeff(&self, i: usize) -> BigRational {
        self.coeffs
            .get(i)
            .cloned()
            .unwrap_or_else(BigRational::zero)
    }

    /// The coefficients padded with zeros (or cut) to exactly `len` entries, constant term first.
    pub fn coeffs_padded(&self, len: usize) -> Vec<BigRational> {
        (0..len).map(|i| self.coeff(i)).collect()
    }

    /// Product of two polynomials.
    pub fn mul(&self, other: &Poly) -> Poly {
        let mut out = vec![BigRational::zero(); self.coeffs.len() + other.coeffs.len() - 1];
        for (i, a) in self.coeffs.iter().enumerate() {
            if a.is_zero() {
                continue;
            }
            for (j, b) in other.coeffs.iter().enumerate() {
                out[i + j] += a * b;
            }
        }
        Poly { coeffs: out }
    }

    /// Multiplies every coefficient by the scalar `s`.
    pub fn scale(&self, s: &BigRational) -> Poly {
        Poly {
            coeffs: self.coeffs.iter().map(|c| c * s).collect(),
        }
    }

    /// Evaluates at `x` (Horner).
    pub fn eval(&self, x: &BigRational) -> BigRational {
        self.coeffs
            .iter()
            .rev()
            .fold(BigRational::zero(), |acc, c| acc * x + c)
    }
}

/// `true` when `q` is negative.
pub fn is_negative(q: &BigRational) -> bool {
    q.is_negative()
}
