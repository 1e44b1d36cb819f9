//! What the benchmark programs (`src/bin/*-bench.rs`) share: a median, a row of their tables, a
//! free loopback port, a process's memory, a scratch folder.

use std::path::PathBuf;

/// The median of `values` (the upper one of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Prints a row of a benchmark table: what, its median, what bounds it, the bound, the ratio,
/// and every run.
pub fn row(what: &str, times: &[f64], bound_what: &str, bound: f64) {
    let m = median(times.to_vec());
    let all: Vec<String> = times.iter().map(|t| format!("{t:.1}")).collect();
    println!(
        "| {what} | {m:.1} | {bound_what} | {bound:.1} | {:.2} | {} |",
        m / bound,
        all.join(" ")
    );
}

pub use crate::free_port;

/// A memory figure of process `pid` from its `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in MiB;
/// 0 if it is gone.
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The resident memory of process `pid`, in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// The peak resident memory of process `pid`, in MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// An empty scratch folder for benchmark `bench`, named `name`, of this process.
pub fn scratch(bench: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("noops-{bench}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
