//! A WAL position, and where a replica is: what failover and switchover compare. Pure.

/// A WAL position (`X/Y`) as a number.
pub fn lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

/// Where a replica is: the newest timeline it has WAL of, and the last WAL position it
/// received. Positions compare by timeline first: a replica left on an older timeline (it
/// received WAL of a lost primary past the point where a promoted replica's timeline parted
/// from it) is behind, whatever its position says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub timeline: u32,
    pub lsn: String,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on timeline {}", self.lsn, self.timeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_a_number() {
        assert_eq!(lsn("0/3000060"), Some(0x300_0060));
        assert_eq!(lsn("1/0"), Some(1 << 32));
        assert_eq!(lsn("nonsense"), None);
    }
}
