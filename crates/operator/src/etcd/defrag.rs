//! When a member is defragmented. etcd's database file does not shrink when keys are deleted
//! and history compacted: the free pages stay in the file until the member is defragmented,
//! which blocks that member while it rewrites the file. So a member is defragmented only once
//! a large share of a large file is free, only while every member is healthy (the others
//! keep the quorum meanwhile), one member at a time, the leader last, and not again soon
//! after. Pure.

use std::time::Duration;

use noops_api::etcd::DefragmentationSpec;

/// A member is not defragmented again within this time.
pub const AGAIN_AFTER: Duration = Duration::from_secs(600);

/// When a member's database counts as fragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The share of the file that is free, in percent.
    pub percent: i64,
    /// The file's least size, in bytes.
    pub min_bytes: i64,
}

/// The policy of `spec`, or `None` when defragmentation is off.
pub fn policy(spec: &DefragmentationSpec) -> Option<Policy> {
    spec.enabled.then_some(())?;
    Some(Policy {
        percent: i64::from(spec.fragmented_percent),
        min_bytes: parse_size(&spec.min_database_size)?,
    })
}

/// Bytes in a size such as `512Ki`, `64Mi`, `1Gi` or `1000`.
pub fn parse_size(size: &str) -> Option<i64> {
    let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len()));
    let n: i64 = digits.parse().ok()?;
    let factor = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(factor)
}

/// Whether a database of `size` bytes with `in_use` of them in use is to be defragmented.
pub fn fragmented(policy: Policy, size: i64, in_use: i64) -> bool {
    size >= policy.min_bytes && size > 0 && (size - in_use.min(size)) * 100 >= policy.percent * size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_read() {
        assert_eq!(parse_size("64Mi"), Some(64 << 20));
        assert_eq!(parse_size("512Ki"), Some(512 << 10));
        assert_eq!(parse_size("2Gi"), Some(2 << 30));
        assert_eq!(parse_size("1000"), Some(1000));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("5MB"), None);
    }

    #[test]
    fn only_a_large_and_mostly_free_file_is_defragmented() {
        let p = policy(&DefragmentationSpec::default()).unwrap();
        assert_eq!(
            p,
            Policy {
                percent: 50,
                min_bytes: 64 << 20
            }
        );
        assert!(fragmented(p, 100 << 20, 40 << 20), "60% free of 100 MiB");
        assert!(!fragmented(p, 100 << 20, 60 << 20), "40% free");
        assert!(!fragmented(p, 10 << 20, 1 << 20), "too small to bother");
        let off = DefragmentationSpec {
            enabled: false,
            ..Default::default()
        };
        assert_eq!(policy(&off), None);
    }
}
