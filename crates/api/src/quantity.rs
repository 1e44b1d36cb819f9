//! Kubernetes resource quantities (`100m`, `1Gi`, `2`, `1e3`) as numbers, for the node agent
//! (the downward API) and the operator (whether a node can hold a pod's requests).

/// The value of quantity `text`, or `None` when it is not one.
pub fn parse(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let base: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    Some(base * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_read_with_their_suffixes() {
        assert_eq!(parse("100m"), Some(0.1));
        assert_eq!(parse("1Gi"), Some(1073741824.0));
        assert_eq!(parse("2"), Some(2.0));
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse("64"), Some(64.0));
        assert_eq!(parse("12x"), None);
        assert_eq!(parse("Gi"), None);
    }
}
