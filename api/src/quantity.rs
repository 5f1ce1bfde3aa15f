//! Kubernetes quantities (`10Gi`, `512Mi`, `1G`, `1e9`, `1500m`) resolved to whole numbers.
//!
//! The grammar is the one of `k8s.io/apimachinery/pkg/api/resource`:
//!
//! ```text
//! quantity  = [sign] number [suffix]
//! number    = digits | digits "." [digits] | "." digits
//! suffix    = binarySI | decimalSI | exponent
//! binarySI  = "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"          (powers of 1024)
//! decimalSI = "m" | "k" | "M" | "G" | "T" | "P" | "E"          (powers of 1000; m = 1/1000)
//! exponent  = ("e" | "E") [sign] digits                       (power of ten)
//! ```
//!
//! fgpu only ever needs non-negative whole numbers (bytes of memory, percent of cores), so
//! [`parse_u64`] evaluates the quantity exactly, with integer arithmetic, and refuses anything
//! negative, fractional (`0.1Ki` = 102.4) or beyond [`u64::MAX`]. Kubernetes itself would
//! round such values; rejecting them keeps a typo from silently becoming a different grant.
//!
//! [`format_u64`] writes the canonical form back (`1073741824` → `1Gi`); the two round-trip.
//!
//! This is hand-written rather than taken from `k8s-openapi` (whose `Quantity` is an
//! unparsed string newtype) to keep this crate light and the arithmetic exact.

use std::fmt;

/// Largest number of significant digits accepted (all of them fit in a `u128`).
pub const MAX_SIGNIFICANT_DIGITS: usize = 38;

/// Binary suffixes with their power of two, largest first.
const BINARY_SUFFIXES: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];

/// Decimal SI suffixes with their power of ten, largest first (`m`, milli, is parse-only).
const DECIMAL_SUFFIXES: [(&str, i64); 6] = [
    ("E", 18),
    ("P", 15),
    ("T", 12),
    ("G", 9),
    ("M", 6),
    ("k", 3),
];

/// A quantity string that does not denote a non-negative whole number that fits in a `u64`.
///
/// Displays as the input (quoted) followed by [`QuantityErrorKind`]'s explanation, e.g.
/// `"0.1Ki" is not a whole number; ...`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} {kind}")]
pub struct QuantityError {
    /// The text that was parsed.
    pub input: String,
    /// What is wrong with it.
    pub kind: QuantityErrorKind,
}

/// Why a quantity was refused. Each message says what would be valid; it reads as the
/// predicate of a sentence whose subject is the offending value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityErrorKind {
    /// The string is empty.
    #[error(
        "is not a quantity; use a number with an optional suffix, such as 512Mi, 10Gi, 1G or 1e9"
    )]
    Empty,
    /// The string does not start with a number, or the number is malformed (`1.2.3`).
    #[error(
        "is not a valid quantity; it must start with a number (digits with at most one decimal point), such as 1.5Gi or 512Mi"
    )]
    InvalidNumber,
    /// The number is followed by something other than a known suffix or an exponent.
    #[error(
        "has an unknown suffix; use one of Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E, m or an exponent such as e9"
    )]
    UnknownSuffix,
    /// The value is below zero.
    #[error("is negative; use 0 or more")]
    Negative,
    /// The value has a fractional part (`1.5`, `0.1Ki`, `1m`).
    #[error("is not a whole number; use a value that resolves to one, such as 1536 or 1.5Ki")]
    Fractional,
    /// The value does not fit in 64 bits.
    #[error("is too large; the maximum is 18446744073709551615 (just under 16Ei)")]
    TooLarge,
    /// More significant digits than this parser evaluates exactly.
    #[error("has more than 38 significant digits; use fewer")]
    TooManyDigits,
}

impl QuantityError {
    fn new(input: &str, kind: QuantityErrorKind) -> Self {
        Self {
            input: input.to_owned(),
            kind,
        }
    }
}

/// The multiplier named by a suffix.
#[derive(Debug, Clone, Copy)]
enum Scale {
    /// Times ten to this power (`""`, `m`, `k`..`E`, `e<n>`).
    Decimal(i64),
    /// Times two to this power (`Ki`..`Ei`).
    Binary(u32),
}

/// Parses a quantity that must resolve to a non-negative whole number no larger than
/// [`u64::MAX`]: `"10Gi"` → 10737418240, `"1G"` → 1000000000, `"1e3"` → 1000,
/// `"2000m"` → 2, `"1.5Ki"` → 1536.
///
/// # Errors
///
/// [`QuantityError`] when the text is not a quantity or its value is negative, fractional,
/// or too large.
///
/// ```
/// use fgpu_api::quantity::parse_u64;
/// assert_eq!(parse_u64("1.5Gi").unwrap(), 1_610_612_736);
/// assert!(parse_u64("0.1Ki").is_err()); // 102.4
/// ```
pub fn parse_u64(input: &str) -> Result<u64, QuantityError> {
    use QuantityErrorKind as K;
    let err = |kind| QuantityError::new(input, kind);
    if input.is_empty() {
        return Err(err(K::Empty));
    }

    // Sign.
    let (negative, rest) = match input.as_bytes()[0] {
        b'-' => (true, &input[1..]),
        b'+' => (false, &input[1..]),
        _ => (false, input),
    };

    // Number: digits, an optional point, digits; at least one digit in all.
    let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (int_digits, rest) = rest.split_at(int_len);
    let (frac_digits, suffix) = match rest.strip_prefix('.') {
        Some(after_point) => {
            let frac_len = after_point.bytes().take_while(u8::is_ascii_digit).count();
            after_point.split_at(frac_len)
        }
        None => ("", rest),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(err(K::InvalidNumber));
    }
    if suffix.starts_with(['.', '+', '-']) {
        return Err(err(K::InvalidNumber));
    }
    let scale = parse_suffix(suffix).ok_or_else(|| err(K::UnknownSuffix))?;

    // Significand: all digits without leading zeros; trailing zeros move into the exponent,
    // so that the significand is never a multiple of ten.
    let all_digits = int_digits.bytes().chain(frac_digits.bytes());
    let digits: Vec<u8> = all_digits.skip_while(|d| *d == b'0').collect();
    let trailing_zeros = digits.iter().rev().take_while(|d| **d == b'0').count();
    let significant = &digits[..digits.len() - trailing_zeros];
    if significant.is_empty() {
        return Ok(0); // Zero, whatever the sign and the suffix.
    }
    if negative {
        return Err(err(K::Negative));
    }
    if significant.len() > MAX_SIGNIFICANT_DIGITS {
        return Err(err(K::TooManyDigits));
    }
    let significand = significant
        .iter()
        .fold(0u128, |acc, d| acc * 10 + u128::from(d - b'0'));
    // Trailing zeros of the whole digit string, minus the digits after the point.
    let zeros_exp = i64::try_from(trailing_zeros).unwrap_or(i64::MAX)
        - i64::try_from(frac_digits.len()).unwrap_or(i64::MAX);

    let value = match scale {
        Scale::Decimal(exp) => scale_decimal(significand, zeros_exp.saturating_add(exp)),
        Scale::Binary(bits) => scale_binary(significand, zeros_exp, bits),
    };
    value.map_err(err)
}

/// Maps a suffix to its multiplier; `None` if unknown.
fn parse_suffix(suffix: &str) -> Option<Scale> {
    match suffix {
        "" => return Some(Scale::Decimal(0)),
        "m" => return Some(Scale::Decimal(-3)),
        _ => {}
    }
    if let Some((_, bits)) = BINARY_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some(Scale::Binary(*bits));
    }
    if let Some((_, exp)) = DECIMAL_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some(Scale::Decimal(*exp));
    }
    // An exponent: e or E, an optional sign, then digits only.
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    let (negative, digits) = match exponent.as_bytes().first()? {
        b'-' => (true, &exponent[1..]),
        b'+' => (false, &exponent[1..]),
        _ => (false, exponent),
    };
    if digits.is_empty() || !digits.bytes().all(|d| d.is_ascii_digit()) {
        return None;
    }
    // Saturate absurd exponents: they overflow (or fractionalise) all the same.
    let magnitude: i64 = digits.parse().unwrap_or(i64::MAX / 4).min(i64::MAX / 4);
    Some(Scale::Decimal(if negative {
        -magnitude
    } else {
        magnitude
    }))
}

/// `significand × 10^exp`, where `significand` is not a multiple of ten.
fn scale_decimal(significand: u128, exp: i64) -> Result<u64, QuantityErrorKind> {
    if exp < 0 {
        // Dividing by ten would need a factor ten that the significand lacks.
        return Err(QuantityErrorKind::Fractional);
    }
    let exp = u32::try_from(exp).map_err(|_| QuantityErrorKind::TooLarge)?;
    10u128
        .checked_pow(exp)
        .and_then(|power| significand.checked_mul(power))
        .and_then(|value| u64::try_from(value).ok())
        .ok_or(QuantityErrorKind::TooLarge)
}

/// `significand × 10^exp10 × 2^bits`, where `significand` is not a multiple of ten.
fn scale_binary(significand: u128, exp10: i64, bits: u32) -> Result<u64, QuantityErrorKind> {
    use QuantityErrorKind as K;
    if exp10 >= 0 {
        let exp10 = u32::try_from(exp10).map_err(|_| K::TooLarge)?;
        return 10u128
            .checked_pow(exp10)
            .and_then(|power| significand.checked_mul(power))
            .and_then(|value| value.checked_mul(1u128 << bits))
            .and_then(|value| u64::try_from(value).ok())
            .ok_or(K::TooLarge);
    }
    // Divide by 10^k = 5^k × 2^k: the fives must come from the significand, the twos from
    // the significand or the suffix.
    let k = u32::try_from(exp10.unsigned_abs()).map_err(|_| K::Fractional)?;
    let five_power = 5u128.checked_pow(k).ok_or(K::Fractional)?;
    if !significand.is_multiple_of(five_power) {
        return Err(K::Fractional);
    }
    let rest = significand / five_power;
    let value = if bits >= k {
        rest.checked_mul(1u128 << (bits - k)).ok_or(K::TooLarge)?
    } else {
        let shift = k - bits;
        if shift >= 128 || rest.trailing_zeros() < shift {
            return Err(K::Fractional);
        }
        rest >> shift
    };
    u64::try_from(value).map_err(|_| K::TooLarge)
}

/// Writes `value` in canonical form: the largest binary suffix that divides it exactly
/// (`1Gi`, `1536Mi`), else the largest exact decimal suffix (`1G`, `1500k`), else plain
/// digits. [`parse_u64`] of the result gives `value` back.
///
/// ```
/// use fgpu_api::quantity::format_u64;
/// assert_eq!(format_u64(10 << 30), "10Gi");
/// assert_eq!(format_u64(1_000_000_000), "1G");
/// assert_eq!(format_u64(1_000_001), "1000001");
/// ```
pub fn format_u64(value: u64) -> String {
    Canonical(value).to_string()
}

/// [`Display`](fmt::Display) adapter behind [`format_u64`].
#[derive(Debug, Clone, Copy)]
struct Canonical(u64);

impl fmt::Display for Canonical {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.0;
        if value == 0 {
            return f.write_str("0");
        }
        for (suffix, bits) in BINARY_SUFFIXES {
            if value.trailing_zeros() >= bits {
                return write!(f, "{}{suffix}", value >> bits);
            }
        }
        for (suffix, exp) in DECIMAL_SUFFIXES {
            let power = 10u64.pow(u32::try_from(exp).unwrap_or(0));
            if value.is_multiple_of(power) {
                return write!(f, "{}{suffix}", value / power);
            }
        }
        write!(f, "{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KI: u64 = 1 << 10;
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn good_quantities() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("-0", 0),
            ("0.0Gi", 0),
            ("+0e99999999999999999999", 0),
            ("1", 1),
            ("+1", 1),
            ("007", 7),
            ("1.", 1),
            ("1.0", 1),
            (".5Ki", 512),
            ("0.5Ki", 512),
            ("1Ki", KI),
            ("512Mi", 512 * MI),
            ("10Gi", 10 * GI),
            ("1.5Gi", 3 * GI / 2),
            ("1.25Mi", 5 * MI / 4),
            ("0.0009765625Ki", 1),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("15Ei", 15 << 60),
            ("1k", 1_000),
            ("1M", 1_000_000),
            ("1G", 1_000_000_000),
            ("1.5G", 1_500_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("18E", 18_000_000_000_000_000_000),
            ("1e9", 1_000_000_000),
            ("1E9", 1_000_000_000),
            ("1e+3", 1_000),
            ("1.5e3", 1_500),
            ("10e-1", 1),
            ("1000m", 1),
            ("1500000m", 1_500),
            ("18446744073709551615", u64::MAX),
            ("18446744073709551615000m", u64::MAX),
            ("0.000000000000000000000000000000000000000000001e45", 1),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_u64(input), Ok(*expected), "{input}");
        }
    }

    #[test]
    fn bad_quantities() {
        use QuantityErrorKind as K;
        let cases: &[(&str, QuantityErrorKind)] = &[
            ("", K::Empty),
            ("Gi", K::InvalidNumber),
            ("-", K::InvalidNumber),
            (".", K::InvalidNumber),
            (" 1", K::InvalidNumber),
            ("1.2.3", K::InvalidNumber),
            ("1e3.5", K::UnknownSuffix),
            ("1..", K::InvalidNumber),
            ("--1", K::InvalidNumber),
            ("1-", K::InvalidNumber),
            ("1 ", K::UnknownSuffix),
            ("1 Gi", K::UnknownSuffix),
            ("1GB", K::UnknownSuffix),
            ("1gi", K::UnknownSuffix),
            ("1K", K::UnknownSuffix),
            ("1e", K::UnknownSuffix),
            ("1e+", K::UnknownSuffix),
            ("1e3Ki", K::UnknownSuffix),
            ("0x10", K::UnknownSuffix),
            ("-1", K::Negative),
            ("-1.5Gi", K::Negative),
            ("1.5", K::Fractional),
            ("0.1Ki", K::Fractional),
            ("1m", K::Fractional),
            ("1e-1", K::Fractional),
            ("0.00048828125Ki", K::Fractional),
            ("18446744073709551616", K::TooLarge),
            ("16Ei", K::TooLarge),
            ("19E", K::TooLarge),
            ("1e20", K::TooLarge),
            ("1e99999999999999999999999", K::TooLarge),
            ("1.00000000000000000000000000000000000001", K::TooManyDigits),
        ];
        for (input, kind) in cases {
            assert_eq!(
                parse_u64(input),
                Err(QuantityError::new(input, *kind)),
                "{input}"
            );
        }
    }

    #[test]
    fn messages_quote_the_input() {
        let err = parse_u64("0.1Ki").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#""0.1Ki" is not a whole number; use a value that resolves to one, such as 1536 or 1.5Ki"#
        );
    }

    #[test]
    fn canonical_forms() {
        let cases: &[(u64, &str)] = &[
            (0, "0"),
            (1, "1"),
            (999, "999"),
            (1_000, "1k"),
            (KI, "1Ki"),
            (1_536, "1536"),
            (3 * GI / 2, "1536Mi"),
            (10 * GI, "10Gi"),
            (1_000_000_000, "1G"),
            (1_500_000_000, "1500M"),
            (15 << 60, "15Ei"),
            (u64::MAX, "18446744073709551615"),
        ];
        for (value, text) in cases {
            assert_eq!(format_u64(*value), *text);
        }
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(value: u64) {
            prop_assert_eq!(parse_u64(&format_u64(value)), Ok(value));
        }

        #[test]
        fn plain_digits_parse_as_themselves(value: u64) {
            prop_assert_eq!(parse_u64(&value.to_string()), Ok(value));
        }

        #[test]
        fn binary_suffixes_multiply(value in 0u64..(1 << 20), index in 0usize..6) {
            let (suffix, bits) = BINARY_SUFFIXES[index];
            let expected = u128::from(value) << bits;
            let parsed = parse_u64(&format!("{value}{suffix}"));
            match u64::try_from(expected) {
                Ok(expected) => prop_assert_eq!(parsed, Ok(expected)),
                Err(_) => prop_assert_eq!(parsed.unwrap_err().kind, QuantityErrorKind::TooLarge),
            }
        }

        #[test]
        fn milli_is_whole_only_in_thousands(value in 0u64..u64::MAX / 1000, extra in 0u64..1000) {
            let parsed = parse_u64(&format!("{}m", value * 1000 + extra));
            if extra == 0 {
                prop_assert_eq!(parsed, Ok(value));
            } else {
                prop_assert_eq!(parsed.unwrap_err().kind, QuantityErrorKind::Fractional);
            }
        }

        #[test]
        fn never_panics(input in "\\PC{0,24}") {
            let _ = parse_u64(&input);
        }

        #[test]
        fn never_panics_on_quantity_like_text(input in "[-+]?[0-9]{0,30}(\\.[0-9]{0,30})?([eE][-+]?[0-9]{1,25}|[kMGTPEm]|[KMGTPE]i)?") {
            let _ = parse_u64(&input);
        }
    }
}
