//! The results of one benchmark run: figures, each beside its floor and a
//! target, the machine it ran on, and the one table `make bench` prints.
//! Some figures also carry an enforced limit: `make bench-ci`
//! (`BENCH_ENFORCE=1`) fails when one of those misses it.
//! Pure: no I/O, so the table and the JSON shape are unit tested.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Version of the JSON shape; bumped when a field changes meaning.
pub const SCHEMA: &str = "ptrain.bench/1";

/// What a figure must satisfy. A ratio is always value / floor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "limit", rename_all = "kebab-case")]
pub enum Target {
    /// value / floor must not exceed this (latencies, costs).
    MaxRatio(f64),
    /// value / floor must reach at least this (throughputs).
    MinRatio(f64),
    /// The value itself must not exceed this (footprints).
    MaxValue(f64),
}

impl Target {
    pub fn describe(&self, unit: &str) -> String {
        match self {
            Target::MaxRatio(r) => format!("<= {r}x"),
            Target::MinRatio(r) => format!(">= {r}x"),
            Target::MaxValue(v) => format!("<= {} {unit}", number(*v)),
        }
    }

    /// None when the figure could not be measured (or has no floor).
    pub fn check(&self, value: Option<f64>, ratio: Option<f64>) -> Option<bool> {
        match self {
            Target::MaxRatio(r) => ratio.map(|x| x <= *r),
            Target::MinRatio(r) => ratio.map(|x| x >= *r),
            Target::MaxValue(v) => value.map(|x| x <= *v),
        }
    }
}

/// A limit CI enforces (`BENCH_ENFORCE=1`): a miss, or a figure that could
/// not be measured, fails the run. Only figures that hold still on a shared,
/// noisy machine get one (CPU time, ratios with a wide guard, counts).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Enforced {
    pub limit: Target,
    /// Why this limit, where it is not the figure's target.
    pub why: String,
    pub pass: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// Stable key, the same in every run: what two runs are compared by.
    pub key: String,
    pub label: String,
    pub unit: String,
    /// None when it could not be measured; `note` then says why.
    pub value: Option<f64>,
    pub floor: Option<f64>,
    /// What the floor is ("bare StartTransientUnit loop", "1st job").
    pub floor_label: String,
    pub ratio: Option<f64>,
    pub target: Option<Target>,
    pub pass: Option<bool>,
    pub note: String,
    #[serde(default)]
    pub enforced: Option<Enforced>,
}

impl Figure {
    pub fn new(key: &str, label: &str, unit: &str, value: Option<f64>) -> Figure {
        Figure {
            key: key.into(),
            label: label.into(),
            unit: unit.into(),
            value,
            floor: None,
            floor_label: String::new(),
            ratio: None,
            target: None,
            pass: None,
            note: String::new(),
            enforced: None,
        }
    }

    pub fn floor(mut self, floor: Option<f64>, label: &str) -> Figure {
        self.floor = floor;
        self.floor_label = label.into();
        self
    }

    pub fn target(mut self, target: Target) -> Figure {
        self.target = Some(target);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Figure {
        self.note = note.into();
        self
    }

    /// Enforces `limit` in CI; `why` explains a limit other than the target.
    pub fn enforce(mut self, limit: Target, why: &str) -> Figure {
        self.enforced = Some(Enforced {
            limit,
            why: why.into(),
            pass: None,
        });
        self
    }

    /// Fills in the ratio and the verdict from value, floor and target.
    pub fn finish(mut self) -> Figure {
        self.ratio = match (self.value, self.floor) {
            (Some(v), Some(f)) if f > 0.0 => Some(v / f),
            _ => None,
        };
        self.pass = self.target.and_then(|t| t.check(self.value, self.ratio));
        if let Some(e) = &mut self.enforced {
            e.pass = e.limit.check(self.value, self.ratio);
        }
        self
    }
}

/// Where the run happened: two runs are comparable only on like machines.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_mib: u64,
    pub kernel: String,
    pub systemd: String,
    /// RFC 3339, UTC.
    pub date: String,
    pub git_commit: String,
    /// 1-minute load average when the run began and ended: other work on
    /// the machine during the run makes figures incomparable.
    #[serde(default)]
    pub load_start: f64,
    #[serde(default)]
    pub load_end: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema: String,
    pub scale: String,
    pub machine: Machine,
    pub wall_secs: f64,
    pub figures: Vec<Figure>,
    /// Raw numbers behind the figures (per-process CPU, counts), by scenario.
    pub details: BTreeMap<String, serde_json::Value>,
}

impl Results {
    pub fn new(scale: &str, machine: Machine) -> Results {
        Results {
            schema: SCHEMA.into(),
            scale: scale.into(),
            machine,
            wall_secs: 0.0,
            figures: Vec::new(),
            details: BTreeMap::new(),
        }
    }

    pub fn push(&mut self, figure: Figure) {
        self.figures.push(figure.finish());
    }

    pub fn figure(&self, key: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.key == key)
    }

    /// The enforced figures that missed their limit or were not measured,
    /// one line each: what `BENCH_ENFORCE=1` fails on.
    pub fn enforced_misses(&self) -> Vec<String> {
        self.figures
            .iter()
            .filter_map(|f| {
                let e = f.enforced.as_ref()?;
                let limit = e.limit.describe(&f.unit);
                let shown = match e.limit {
                    Target::MaxValue(_) => with_unit(f.value, &f.unit),
                    _ => f.ratio.map_or("n/a".into(), |r| format!("{r:.2}x")),
                };
                match e.pass {
                    Some(true) => None,
                    Some(false) => Some(format!(
                        "{} ({}): {shown}, limit {limit}",
                        f.label.trim(),
                        f.key
                    )),
                    None => Some(format!(
                        "{} ({}): not measured ({}), limit {limit}",
                        f.label.trim(),
                        f.key,
                        if f.note.is_empty() {
                            "no value or floor"
                        } else {
                            &f.note
                        }
                    )),
                }
            })
            .collect()
    }

    /// The one table: figure, value, floor, ratio, target and verdict, and
    /// the previous run's value when `previous` is given.
    pub fn table(&self, previous: Option<&Results>) -> String {
        let mut rows: Vec<Vec<String>> = vec![vec![
            "figure".into(),
            "value".into(),
            "floor".into(),
            "ratio".into(),
            "target".into(),
            "result".into(),
            "enforced".into(),
        ]];
        if previous.is_some() {
            rows[0].push("previous".into());
        }
        for f in &self.figures {
            let mut row = vec![
                f.label.clone(),
                with_unit(f.value, &f.unit),
                match f.floor {
                    Some(v) => format!("{} ({})", with_unit(Some(v), &f.unit), f.floor_label),
                    None => "-".into(),
                },
                f.ratio.map_or("-".into(), |r| format!("{r:.2}x")),
                f.target.map_or("-".into(), |t| t.describe(&f.unit)),
                match f.pass {
                    Some(true) => "pass".into(),
                    Some(false) => "FAIL".into(),
                    None if f.target.is_some() => "n/a".into(),
                    None => "-".into(),
                },
                match &f.enforced {
                    Some(e) => format!(
                        "{} {}",
                        e.limit.describe(&f.unit),
                        match e.pass {
                            Some(true) => "pass",
                            Some(false) => "FAIL",
                            None => "n/a",
                        }
                    ),
                    None => "-".into(),
                },
            ];
            if let Some(prev) = previous {
                row.push(with_unit(
                    prev.figure(&f.key).and_then(|p| p.value),
                    &f.unit,
                ));
            }
            rows.push(row);
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for (i, row) in rows.iter().enumerate() {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
            if i == 0 {
                let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
                out.push_str(&rule.join("  "));
                out.push('\n');
            }
        }
        let mut notes: Vec<String> = Vec::new();
        // Why a limit: once for all the figures that share it.
        let mut whys: Vec<(String, Vec<&str>)> = Vec::new();
        for f in &self.figures {
            let label = f.label.trim();
            if !f.note.is_empty() {
                notes.push(format!("  {label}: {}", f.note));
            }
            if let Some(e) = f.enforced.as_ref().filter(|e| !e.why.is_empty()) {
                let why = format!("enforced at {}: {}", e.limit.describe(&f.unit), e.why);
                match whys.iter_mut().find(|(w, _)| *w == why) {
                    Some((_, labels)) => labels.push(label),
                    None => whys.push((why, vec![label])),
                }
            }
        }
        for (why, labels) in whys {
            notes.push(format!("  {}: {why}", labels.join("; ")));
        }
        if self.figures.iter().any(|f| f.enforced.is_some()) {
            notes.push(
                "  enforced: `make bench-ci` (BENCH_ENFORCE=1) fails when one of these misses its limit or is not measured; \
                 the other targets, wall-clock latency and throughput among them, are reported only: shared CI machines are too noisy for them"
                    .into(),
            );
        }
        if !notes.is_empty() {
            out.push_str("notes:\n");
            out.push_str(&notes.join("\n"));
            out.push('\n');
        }
        let m = &self.machine;
        out.push_str(&format!(
            "scale {}, {:.0} s, load {:.1} to {:.1}; {} CPUs ({}), {} MiB, kernel {}, {}, {}, commit {}\n",
            self.scale,
            self.wall_secs,
            m.load_start,
            m.load_end,
            m.nproc,
            m.cpu_model,
            m.mem_total_mib,
            m.kernel,
            m.systemd,
            m.date,
            m.git_commit
        ));
        out
    }
}

fn with_unit(value: Option<f64>, unit: &str) -> String {
    match value {
        Some(v) => format!("{} {unit}", number(v)),
        None => "n/a".into(),
    }
}

/// Three significant digits, without a pointless fraction.
fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Nearest-rank percentile (q in 0..=1) of unsorted samples.
pub fn percentile(samples: &[f64], q: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    // Unused in the bench target: without libtest (harness = false) its
    // #[test] functions are dropped; they run in the integration tests.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let s: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), Some(50.0));
        assert_eq!(percentile(&s, 0.99), Some(99.0));
        assert_eq!(percentile(&s, 1.0), Some(100.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn targets_judge_the_ratio_or_the_value() {
        let f = Figure::new("lat.p99", "p99", "ms", Some(30.0))
            .floor(Some(20.0), "bare")
            .target(Target::MaxRatio(1.5))
            .finish();
        assert_eq!(f.ratio, Some(1.5));
        assert_eq!(f.pass, Some(true));
        let f = Figure::new("tp", "jobs/s", "jobs/s", Some(70.0))
            .floor(Some(100.0), "bare")
            .target(Target::MinRatio(0.8))
            .finish();
        assert_eq!(f.pass, Some(false));
        let f = Figure::new("rss", "rss", "MiB", Some(12.0))
            .target(Target::MaxValue(20.0))
            .finish();
        assert_eq!((f.ratio, f.pass), (None, Some(true)));
        let f = Figure::new("x", "x", "ms", None)
            .floor(Some(1.0), "bare")
            .target(Target::MaxRatio(1.5))
            .finish();
        assert_eq!(f.pass, None);
    }

    #[test]
    fn the_table_has_every_figure_and_the_json_round_trips() {
        let mut r = Results::new("ci", Machine::default());
        r.push(
            Figure::new("lat.p99", "drop-to-active p99", "ms", Some(31.25))
                .floor(Some(25.0), "bare")
                .target(Target::MaxRatio(1.5)),
        );
        r.push(Figure::new("list", "ptrain list", "ms", None).note("bus said no"));
        let mut prev = r.clone();
        prev.figures[0].value = Some(40.0);
        let table = r.table(Some(&prev));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("figure"), "{table}");
        assert!(lines[0].ends_with("previous"), "{table}");
        assert!(lines[2].contains("31.2 ms") && lines[2].contains("1.25x"));
        assert!(lines[2].contains("<= 1.5x") && lines[2].contains("pass"));
        assert!(lines[2].ends_with("40 ms"), "{table}");
        assert!(lines[3].contains("n/a"), "{table}");
        assert!(table.contains("ptrain list: bus said no"), "{table}");
        let json = serde_json::to_string(&r).unwrap();
        let back: Results = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn enforced_limits_are_judged_shown_and_listed_when_missed() {
        let mut r = Results::new("ci", Machine::default());
        r.push(
            Figure::new("growth.cpu.10", "  CPU per job, job #10", "ms", Some(13.0))
                .floor(Some(10.0), "job #1")
                .target(Target::MaxRatio(1.25))
                .enforce(Target::MaxRatio(1.5), "CPU time of 20 jobs varies"),
        );
        r.push(
            Figure::new("wakeups", "wake-ups", "", Some(9.0))
                .target(Target::MaxValue(4.0))
                .enforce(Target::MaxValue(4.0), ""),
        );
        r.push(
            Figure::new("status", "Status(ID)", "ms", None)
                .floor(Some(0.3), "early history")
                .enforce(Target::MaxRatio(2.0), "")
                .note("bus said no"),
        );
        r.push(Figure::new("lat", "latency", "ms", Some(9.0)).target(Target::MaxValue(1.0)));
        let f = r.figure("growth.cpu.10").unwrap();
        // Misses the target, within the enforced limit.
        assert_eq!(f.pass, Some(false));
        assert_eq!(f.enforced.as_ref().unwrap().pass, Some(true));
        let misses = r.enforced_misses();
        assert_eq!(misses.len(), 2, "{misses:?}");
        assert!(
            misses[0].contains("wakeups") && misses[0].contains("9"),
            "{misses:?}"
        );
        assert!(
            misses[1].contains("not measured (bus said no)"),
            "{misses:?}"
        );
        let table = r.table(None);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with("enforced"), "{table}");
        assert!(lines[2].ends_with("<= 1.5x pass"), "{table}");
        assert!(lines[3].ends_with("FAIL"), "{table}");
        assert!(lines[5].ends_with('-'), "{table}");
        assert!(
            table.contains("CPU per job, job #10: enforced at <= 1.5x: CPU time of 20 jobs varies"),
            "{table}"
        );
        assert!(table.contains("BENCH_ENFORCE=1"), "{table}");
        let back: Results = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
