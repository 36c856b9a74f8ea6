//! Resource limits for an `exec` robot's processes: what a spec asks
//! (`spec.limits: {memory, pids, cpu}`), the worker's default
//! (`--exec-default-limits`), how they travel to the shim, and what the shim reports
//! it applied. Pure and unit-tested; the I/O (cgroups, else rlimits) is
//! [`super::cgroup`]. They exist so one leaking or fork-bombing robot cannot take down
//! its worker and every robot of its slots. What each mechanism enforces, and what it
//! cannot (`applied_limits.unenforced`), is in docs/robots.md, "Bounding an exec
//! robot's resources".

use std::collections::BTreeMap;

use bson::{Bson, Document};
use serde::{Deserialize, Serialize};

/// The spec field.
pub(crate) const SPEC_FIELD: &str = "limits";

/// The smallest memory limit: below it not even a shell starts.
pub(crate) const MIN_MEMORY: u64 = 4_000_000;
/// The most processes a limit may name (the kernel's own `pid_max` ceiling).
pub(crate) const MAX_PIDS: u64 = 4_194_304;
/// A cpu limit's bounds, in thousandths of a core.
pub(crate) const CPU_MILLIS: (u64, u64) = (10, 1024 * 1000);

/// What a robot's processes may use; None: not bounded (by this robot's own
/// limits; the worker's container or unit may still bound it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Bytes.
    pub(crate) memory: Option<u64>,
    /// Processes (threads count, as the kernel counts them).
    pub(crate) pids: Option<u64>,
    /// Thousandths of a core.
    pub(crate) cpu_millis: Option<u64>,
}

impl Limits {
    pub(crate) fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// Each limit this one leaves unset, taken from `default`.
    pub(crate) fn or(self, default: Limits) -> Limits {
        Limits {
            memory: self.memory.or(default.memory),
            pids: self.pids.or(default.pids),
            cpu_millis: self.cpu_millis.or(default.cpu_millis),
        }
    }

    /// Reads `spec.limits` (absent or null: none). The error names the field and
    /// what it takes.
    pub(crate) fn from_spec(spec: &Document) -> Result<Limits, String> {
        match spec.get(SPEC_FIELD) {
            None | Some(Bson::Null) => Ok(Limits::default()),
            Some(Bson::Document(d)) => Limits::from_doc(d, "spec.limits"),
            Some(other) => Err(format!(
                "spec.limits must be a document such as {{\"memory\": \"256MB\", \"pids\": 64, \"cpu\": 0.5}}, found {other}"
            )),
        }
    }

    /// Reads a limits document; `what` names it in errors.
    pub(crate) fn from_doc(d: &Document, what: &str) -> Result<Limits, String> {
        let mut limits = Limits::default();
        for (key, value) in d {
            match key.as_str() {
                "memory" => limits.memory = memory(value, what)?,
                "pids" => limits.pids = pids(value, what)?,
                "cpu" => limits.cpu_millis = cpu(value, what)?,
                other => {
                    return Err(format!(
                        "unknown field {what}.{} (known: memory, pids, cpu)",
                        crate::printable::escape(other)
                    ))
                }
            }
        }
        Ok(limits)
    }

    /// Reads `--exec-default-limits`: the same JSON document a spec's `limits` is.
    pub(crate) fn from_json(text: &str) -> Result<Limits, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            format!(
                "--exec-default-limits must be JSON such as '{{\"memory\": \"512MB\", \"pids\": 256}}': {e}"
            )
        })?;
        match Bson::try_from(value) {
            Ok(Bson::Document(d)) => Limits::from_doc(&d, "--exec-default-limits"),
            _ => Err("--exec-default-limits must be a JSON object such as '{\"memory\": \"512MB\", \"pids\": 256}'".into()),
        }
    }

    /// The shim's argument: `memory=B,pids=N,cpu=M` (cpu in thousandths), or `-`.
    pub(crate) fn to_arg(self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.memory {
            parts.push(format!("memory={m}"));
        }
        if let Some(p) = self.pids {
            parts.push(format!("pids={p}"));
        }
        if let Some(c) = self.cpu_millis {
            parts.push(format!("cpu={c}"));
        }
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(",")
        }
    }

    pub(crate) fn from_arg(arg: &str) -> Result<Limits, String> {
        let mut limits = Limits::default();
        if arg == "-" {
            return Ok(limits);
        }
        for part in arg.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("bad limits argument {part:?}"))?;
            let n: u64 = value
                .parse()
                .map_err(|_| format!("bad limits argument {part:?}"))?;
            match key {
                "memory" => limits.memory = Some(n),
                "pids" => limits.pids = Some(n),
                "cpu" => limits.cpu_millis = Some(n),
                _ => return Err(format!("bad limits argument {part:?}")),
            }
        }
        Ok(limits)
    }

    /// For people: `memory 100.0 MB, pids 64, cpu 0.5`; `none`.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.memory {
            parts.push(format!("memory {}", bytes(m)));
        }
        if let Some(p) = self.pids {
            parts.push(format!("pids {p}"));
        }
        if let Some(c) = self.cpu_millis {
            parts.push(format!("cpu {}", cores(c)));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A byte count for people (decimal units, as a spec's `"100MB"` reads).
pub(crate) fn bytes(n: u64) -> String {
    bytesize::ByteSize(n).display().si().to_string()
}

/// Thousandths of a core as cores: `0.5`, `2`.
pub(crate) fn cores(millis: u64) -> String {
    let whole = millis / 1000;
    let frac = millis % 1000;
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0'))
    }
}

fn memory(v: &Bson, what: &str) -> Result<Option<u64>, String> {
    let n = match v {
        Bson::Null => return Ok(None),
        Bson::String(s) => s.trim().parse::<bytesize::ByteSize>().map(|b| b.0).map_err(|_| {
            format!(
                "{what}.memory {:?} is not a size; write e.g. \"256MB\", \"1GiB\" or a number of bytes",
                crate::printable::escape(s)
            )
        })?,
        other => match whole(other) {
            Some(n) => n,
            None => {
                return Err(format!(
                    "{what}.memory must be a size such as \"256MB\" or a number of bytes, found {other}"
                ))
            }
        },
    };
    if n < MIN_MEMORY {
        return Err(format!(
            "{what}.memory {} is below the smallest limit, {} (not even a shell starts in less)",
            bytes(n),
            bytes(MIN_MEMORY)
        ));
    }
    Ok(Some(n))
}

fn pids(v: &Bson, what: &str) -> Result<Option<u64>, String> {
    if *v == Bson::Null {
        return Ok(None);
    }
    match whole(v) {
        Some(n) if (1..=MAX_PIDS).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "{what}.pids must be a whole number of processes from 1 to {MAX_PIDS}, found {v}"
        )),
    }
}

fn cpu(v: &Bson, what: &str) -> Result<Option<u64>, String> {
    let cores = match v {
        Bson::Null => return Ok(None),
        Bson::Double(f) => *f,
        Bson::Int32(n) => f64::from(*n),
        Bson::Int64(n) => *n as f64,
        other => {
            return Err(format!(
                "{what}.cpu must be a number of cores such as 0.5 or 2, found {other}"
            ))
        }
    };
    let millis = (cores * 1000.0).round();
    let (min, max) = CPU_MILLIS;
    if !millis.is_finite() || millis < min as f64 || millis > max as f64 {
        return Err(format!(
            "{what}.cpu must be from {} to {} cores, found {v}",
            self::cores(min),
            self::cores(max)
        ));
    }
    Ok(Some(millis as u64))
}

/// A whole, non-negative number however it was stored.
fn whole(v: &Bson) -> Option<u64> {
    match v {
        Bson::Int32(n) => u64::try_from(*n).ok(),
        Bson::Int64(n) => u64::try_from(*n).ok(),
        Bson::Double(f) if f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64 => Some(*f as u64),
        _ => None,
    }
}

/// Which mechanism the worker wants its shims to use (`--exec-limits-via`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Via {
    /// cgroups where this worker may create them, rlimits otherwise.
    #[default]
    Auto,
    /// cgroups or nothing: a robot with limits does not start where they cannot be
    /// made (its status says why).
    Cgroup,
    /// rlimits even where cgroups would work.
    Rlimit,
}

impl Via {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Via::Auto => "auto",
            Via::Cgroup => "cgroup",
            Via::Rlimit => "rlimit",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Via> {
        [Via::Auto, Via::Cgroup, Via::Rlimit]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// What the shim applied, as it reports it and as the robot's document stores it
/// (`applied_limits`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Applied {
    /// `cgroup v1`, `cgroup v2` or `rlimit`.
    pub(crate) mechanism: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pids: Option<u64>,
    /// Cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu: Option<f64>,
    /// Each asked limit this mechanism cannot enforce, with why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) unenforced: BTreeMap<String, String>,
    /// Why cgroups were not used, when they were not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
}

impl Applied {
    /// What rlimits make of `limits`; `root`: the robot runs as root, which the
    /// kernel exempts from `RLIMIT_NPROC`.
    pub(crate) fn rlimit(limits: &Limits, root: bool, note: Option<String>) -> Applied {
        let mut unenforced = BTreeMap::new();
        if limits.pids.is_some() && root {
            unenforced.insert(
                "pids".to_string(),
                "the kernel does not apply RLIMIT_NPROC to root; the worker's container or unit is the bound".to_string(),
            );
        }
        if limits.cpu_millis.is_some() {
            unenforced.insert(
                "cpu".to_string(),
                "rlimits cannot bound a rate (RLIMIT_CPU ends a process after so many CPU seconds)"
                    .to_string(),
            );
        }
        Applied {
            mechanism: "rlimit".into(),
            memory: limits.memory,
            pids: limits.pids,
            cpu: limits.cpu_millis.map(|c| c as f64 / 1000.0),
            unenforced,
            note,
        }
    }

    pub(crate) fn cgroup(version: &str, limits: &Limits) -> Applied {
        Applied {
            mechanism: format!("cgroup {version}"),
            memory: limits.memory,
            pids: limits.pids,
            cpu: limits.cpu_millis.map(|c| c as f64 / 1000.0),
            unenforced: BTreeMap::new(),
            note: None,
        }
    }

    /// For `robot show` and the dashboard: `cgroup v1: memory 100.0 MB, pids 64`,
    /// then what is not enforced and why cgroups were not used.
    pub(crate) fn describe(&self) -> String {
        let limits = Limits {
            memory: self.memory,
            pids: self.pids,
            cpu_millis: self.cpu.map(|c| (c * 1000.0).round() as u64),
        };
        let mut s = format!("{}: {}", self.mechanism, limits.describe());
        for (field, why) in &self.unenforced {
            s.push_str(&format!("; {field} not enforced ({why})"));
        }
        if let Some(note) = &self.note {
            s.push_str(&format!("; {note}"));
        }
        s
    }
}

/// What a robot's process lines report about limits, read from its document's
/// `applied_limits` (hostile input: a hand edit may put anything there).
pub(crate) fn describe_stored(doc: &Document) -> Option<String> {
    let stored = doc.get_document(crate::db::field::APPLIED_LIMITS).ok()?;
    let applied: Applied = bson::from_document(stored.clone()).ok()?;
    Some(crate::printable::escape(&applied.describe()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn spec_limits_read_sizes_counts_and_cores() {
        let l = Limits::from_spec(&doc! {"limits": {"memory": "100MB", "pids": 64, "cpu": 0.5}})
            .unwrap();
        assert_eq!(l.memory, Some(100_000_000));
        assert_eq!(l.pids, Some(64));
        assert_eq!(l.cpu_millis, Some(500));
        let l = Limits::from_spec(&doc! {"limits": {"memory": "1GiB", "cpu": 2}}).unwrap();
        assert_eq!(l.memory, Some(1 << 30));
        assert_eq!(l.cpu_millis, Some(2000));
        assert_eq!(
            Limits::from_spec(&doc! {"limits": {"memory": 64_000_000_i64}})
                .unwrap()
                .memory,
            Some(64_000_000)
        );
        assert!(Limits::from_spec(&doc! {}).unwrap().is_empty());
        assert!(Limits::from_spec(&doc! {"limits": null})
            .unwrap()
            .is_empty());
    }

    #[test]
    fn bad_limits_say_what_the_field_takes() {
        for (bad, says) in [
            (doc! {"limits": 5}, "must be a document"),
            (doc! {"limits": {"memory": "lots"}}, "is not a size"),
            (doc! {"limits": {"memory": "1KB"}}, "below the smallest"),
            (doc! {"limits": {"memory": true}}, "must be a size"),
            (doc! {"limits": {"pids": 0}}, "from 1 to"),
            (doc! {"limits": {"pids": 2.5}}, "whole number"),
            (doc! {"limits": {"pids": "64"}}, "whole number"),
            (doc! {"limits": {"cpu": 0.001}}, "from 0.01 to"),
            (doc! {"limits": {"cpu": "half"}}, "number of cores"),
            (doc! {"limits": {"cpu": f64::NAN}}, "from 0.01"),
            (
                doc! {"limits": {"disk": 1}},
                "unknown field spec.limits.disk",
            ),
        ] {
            let e = Limits::from_spec(&bad).err().unwrap_or_default();
            assert!(e.contains(says), "{bad}: {e:?}");
        }
    }

    #[test]
    fn a_robot_s_own_limits_win_field_by_field_over_the_default() {
        let default = Limits::from_json(r#"{"memory": "512MB", "pids": 256}"#).unwrap();
        let own = Limits {
            pids: Some(64),
            ..Default::default()
        };
        let l = own.or(default);
        assert_eq!(l.memory, Some(512_000_000));
        assert_eq!(l.pids, Some(64));
        assert_eq!(l.cpu_millis, None);
        assert!(Limits::from_json("memory=1").is_err());
        assert!(Limits::from_json("[1]").is_err());
        let e = Limits::from_json(r#"{"pids": -1}"#).unwrap_err();
        assert!(e.starts_with("--exec-default-limits.pids"), "{e}");
    }

    #[test]
    fn the_shim_argument_round_trips() {
        for l in [
            Limits::default(),
            Limits {
                memory: Some(100_000_000),
                pids: Some(64),
                cpu_millis: Some(250),
            },
            Limits {
                pids: Some(1),
                ..Default::default()
            },
        ] {
            assert_eq!(Limits::from_arg(&l.to_arg()), Ok(l));
        }
        assert!(Limits::from_arg("memory=x").is_err());
        assert!(Limits::from_arg("disk=1").is_err());
        assert!(Limits::from_arg("").is_err());
    }

    #[test]
    fn rlimits_say_what_they_cannot_enforce() {
        let l = Limits {
            memory: Some(100_000_000),
            pids: Some(64),
            cpu_millis: Some(500),
        };
        let a = Applied::rlimit(&l, true, Some("cgroups: read-only here".into()));
        assert_eq!(a.unenforced.keys().collect::<Vec<_>>(), vec!["cpu", "pids"]);
        let d = a.describe();
        assert!(
            d.starts_with("rlimit: memory 100.0 MB, pids 64, cpu 0.5"),
            "{d}"
        );
        assert!(d.contains("pids not enforced (the kernel does not apply RLIMIT_NPROC to root"));
        assert!(d.ends_with("; cgroups: read-only here"), "{d}");
        let a = Applied::rlimit(&l, false, None);
        assert_eq!(a.unenforced.keys().collect::<Vec<_>>(), vec!["cpu"]);
        let c = Applied::cgroup("v1", &l);
        assert_eq!(c.describe(), "cgroup v1: memory 100.0 MB, pids 64, cpu 0.5");
        let stored = bson::to_document(&c).unwrap();
        assert_eq!(
            describe_stored(&doc! {"applied_limits": stored}).as_deref(),
            Some("cgroup v1: memory 100.0 MB, pids 64, cpu 0.5")
        );
        assert_eq!(describe_stored(&doc! {"applied_limits": 5}), None);
    }

    #[test]
    fn cores_print_as_people_write_them() {
        assert_eq!(cores(500), "0.5");
        assert_eq!(cores(2000), "2");
        assert_eq!(cores(1250), "1.25");
        assert_eq!(cores(10), "0.01");
    }
}
