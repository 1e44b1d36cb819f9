//! Text as a URI carries it: the connection Secret's `uri` writes its user and password so,
//! and `kubectl noops report` scrubs them in that form too.

/// `text` with everything but unreserved URI characters percent-encoded (RFC 3986).
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_unreserved_characters_stay() {
        assert_eq!(super::percent_encode("a-Z_0.~ b@c/%"), "a-Z_0.~%20b%40c%2F%25");
    }
}
