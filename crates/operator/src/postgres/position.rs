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

impl Position {
    /// Whether a replica here has received past the start of the record at `end` (a stopped
    /// server's shutdown checkpoint): every commit before it, on `end`'s timeline.
    pub fn past(&self, end: &Position) -> bool {
        self.timeline == end.timeline && lsn(&self.lsn) > lsn(&end.lsn)
    }
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

    #[test]
    fn past_a_record_means_beyond_its_start_on_its_timeline() {
        let at = |timeline, lsn: &str| Position {
            timeline,
            lsn: lsn.into(),
        };
        let end = at(2, "0/4026F00");
        assert!(at(2, "0/4026F78").past(&end));
        assert!(
            !at(2, "0/4026F00").past(&end),
            "at its start, the record is not received"
        );
        assert!(!at(2, "0/4000000").past(&end));
        assert!(!at(1, "0/5000000").past(&end), "another timeline is another history");
        assert!(!at(3, "0/5000000").past(&end));
    }
}
