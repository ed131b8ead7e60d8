//! Lower-case hex, the one way bytes are shown as text: digests and ids
//! ([`lower`]), binary values in JSON and on the console ([`prefixed`],
//! `0x` first, as MariaDB's own `SELECT` shows a binary literal).

use std::fmt::Write;

/// The lower-case hex of `bytes`, two digits per byte.
pub fn lower(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 * bytes.len());
    push(&mut text, bytes);
    text
}

/// `0x` and the lower-case hex of `bytes`.
pub fn prefixed(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 + 2 * bytes.len());
    text.push_str("0x");
    push(&mut text, bytes);
    text
}

/// The bytes of [`lower`]'s text (either case); `None` for text that is
/// not an even number of hex digits.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn push(text: &mut String, bytes: &[u8]) {
    for b in bytes {
        let _ = write!(text, "{b:02x}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_lower_case_digits_per_byte() {
        assert_eq!(lower(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(prefixed(&[0xde, 0xad]), "0xdead");
        assert_eq!(lower(&[]), "");
        assert_eq!(prefixed(&[]), "0x");
        assert_eq!(decode("000fA0ff"), Some(vec![0x00, 0x0f, 0xa0, 0xff]));
        assert_eq!(decode(""), Some(vec![]));
        assert_eq!(decode("abc"), None);
        assert_eq!(decode("zz"), None);
    }
}
