//! A status report: what one resource is and does, the same for every kind, printed as text
//! for people or as JSON for scripts. Pure.

use comfy_table::{Table, presets::NOTHING};
use serde::Serialize;

/// The report of one resource.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Its Ready condition is True for its current generation.
    pub ready: bool,
    pub phase: Option<String>,
    /// The spec says paused: the operator changes nothing.
    pub paused: bool,
    /// One-line facts, in order: (what, value).
    pub facts: Vec<(String, String)>,
    /// Tables: members, backups, certificates.
    pub tables: Vec<Section>,
    /// Conditions that are not as they should be: (type, reason, message).
    pub problems: Vec<(String, String, String)>,
    /// The most recent Warning Events, newest last: (age, reason, message).
    pub warnings: Vec<(String, String, String)>,
}

/// A titled table.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Section {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Report {
    pub fn fact(&mut self, what: &str, value: impl Into<String>) {
        self.facts.push((what.into(), value.into()));
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let state = if self.ready { "Ready" } else { "Not ready" };
        let phase = self.phase.as_deref().map(|p| format!(" ({p})")).unwrap_or_default();
        let paused = if self.paused { ", PAUSED" } else { "" };
        out.push_str(&format!(
            "{} {}/{}: {state}{phase}{paused}\n",
            self.kind, self.namespace, self.name
        ));
        let width = self.facts.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (what, value) in &self.facts {
            out.push_str(&format!("  {what:width$}  {value}\n"));
        }
        for section in &self.tables {
            out.push_str(&format!("\n{}:\n", section.title));
            if section.rows.is_empty() {
                out.push_str("  (none)\n");
                continue;
            }
            let mut table = Table::new();
            table.load_preset(NOTHING).set_header(section.header.clone());
            for row in &section.rows {
                table.add_row(row.clone());
            }
            for line in table.to_string().lines() {
                out.push_str(&format!(" {}\n", line.trim_end()));
            }
        }
        if !self.problems.is_empty() {
            out.push_str("\nProblems:\n");
            for (type_, reason, message) in &self.problems {
                out.push_str(&format!("  {type_} ({reason}): {message}\n"));
            }
        }
        if !self.warnings.is_empty() {
            out.push_str("\nRecent warnings:\n");
            for (age, reason, message) in &self.warnings {
                out.push_str(&format!("  {age:>5} ago  {reason}: {message}\n"));
            }
        }
        out
    }
}

/// A duration as people say it: `45s`, `12m`, `3h`, `2d`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// A size in bytes as people say it: `512 B`, `1.5 MiB`.
pub fn size(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes.max(0) as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_sizes_read_as_people_say_them() {
        assert_eq!(age(45), "45s");
        assert_eq!(age(12 * 60), "12m");
        assert_eq!(age(3 * 3600), "3h");
        assert_eq!(age(3 * 86400), "3d");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536 * 1024), "1.5 MiB");
    }

    #[test]
    fn the_text_has_the_state_the_facts_the_tables_and_the_warnings() {
        let mut report = Report {
            kind: "EtcdCluster".into(),
            namespace: "db".into(),
            name: "main".into(),
            ready: false,
            phase: Some("Degraded".into()),
            paused: true,
            ..Default::default()
        };
        report.fact("version", "3.5.21");
        report.tables.push(Section {
            title: "Members".into(),
            header: vec!["NAME".into(), "ROLE".into()],
            rows: vec![vec!["main-0".into(), "leader".into()]],
        });
        report.tables.push(Section {
            title: "Backups".into(),
            ..Default::default()
        });
        report
            .warnings
            .push(("2m".into(), "MemberPodStuck".into(), "no image".into()));
        let text = report.text();
        assert!(
            text.starts_with("EtcdCluster db/main: Not ready (Degraded), PAUSED\n"),
            "{text}"
        );
        assert!(text.contains("version  3.5.21"), "{text}");
        assert!(text.contains("main-0") && text.contains("leader"), "{text}");
        assert!(text.contains("Backups:\n  (none)"), "{text}");
        assert!(text.contains("2m ago  MemberPodStuck: no image"), "{text}");
    }
}
