//! `deploy/`: the Prometheus alert rules and the Grafana dashboard name only metrics
//! the worker exports, the rules pass `promtool` (check and unit tests) where it is
//! installed, and the dashboard is well-formed.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use slotpool::metrics::Metrics;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `slotpool_…` sample name on the worker's /metrics page, and every metric
/// family's name (a histogram's, say, as a text names it).
fn exported() -> BTreeSet<String> {
    let page = Metrics::default().render();
    let samples = page
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next());
    let families = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next());
    samples.chain(families).map(str::to_string).collect()
}

/// Every `slotpool_…` name a text mentions.
fn mentioned(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("slotpool_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_rules_and_the_dashboard_name_only_exported_metrics() {
    let exported = exported();
    for file in [
        "deploy/prometheus/alerts.yml",
        "deploy/prometheus/alerts.test.yml",
        "deploy/grafana/slotpool.json",
    ] {
        let names = mentioned(&read(file));
        assert!(!names.is_empty(), "{file} names no metric");
        let unknown: Vec<&String> = names.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses metrics the worker does not export: {unknown:?}\nexported: {exported:?}"
        );
    }
}

#[test]
fn the_alert_rules_cover_what_operators_must_hear_about() {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read("deploy/prometheus/alerts.yml")).unwrap();
    let exprs: Vec<String> = rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect();
    for needed in [
        "slotpool_slot_unheld_seconds",
        "slotpool_self_fences_total",
        "slotpool_fenced_writes_total",
        "slotpool_robots_restarting",
        "slotpool_slot_held == 0",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(needed)),
            "no rule on {needed}: {exprs:?}"
        );
    }
}

#[test]
fn the_alert_rules_pass_promtool() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    let Ok(version) = Command::new("promtool").arg("--version").output() else {
        // scripts/ensure-tools.sh installs it (Debian's `prometheus`) where it can.
        eprintln!("promtool is not installed: the rules were checked for metric names only");
        return;
    };
    assert!(version.status.success());
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_dashboard_is_well_formed() {
    let d: serde_json::Value = serde_json::from_str(&read("deploy/grafana/slotpool.json")).unwrap();
    assert_eq!(d["uid"], "slotpool");
    let panels = d["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let ids: BTreeSet<i64> = panels.iter().map(|p| p["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    for p in panels {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", p["title"]);
        for t in targets {
            assert!(!t["expr"].as_str().unwrap().is_empty());
        }
    }
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(vars
        .iter()
        .any(|v| v["name"] == "datasource" && v["type"] == "datasource"));
}

#[test]
fn compose_file_and_dockerfile_hold_together() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/compose.yaml")).unwrap();
    let y: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let svc = &y["services"];
    let mongo = &svc["mongo"];
    let cmd: Vec<&str> = mongo["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        cmd.contains(&"--replSet"),
        "mongo must run as a replica set, as in production"
    );
    assert!(mongo["healthcheck"]["test"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|v| v.as_str().unwrap().contains("rs.initiate")));
    assert!(mongo["volumes"][0]
        .as_str()
        .unwrap()
        .starts_with("mongo-data:"));
    assert!(y["volumes"]["mongo-data"].is_null() || y["volumes"]["mongo-data"].is_mapping());
    let init = &svc["init"];
    assert_eq!(init["command"][0].as_str(), Some("init"));
    assert_eq!(
        init["depends_on"]["mongo"]["condition"].as_str(),
        Some("service_healthy")
    );
    let worker = &svc["worker"];
    assert_eq!(
        worker["depends_on"]["init"]["condition"].as_str(),
        Some("service_completed_successfully")
    );
    assert!(
        worker["ports"].is_null(),
        "scaled workers must not publish fixed host ports"
    );
    assert!(
        worker["container_name"].is_null(),
        "a container_name prevents --scale"
    );
    assert!(worker["environment"]["MONGODB_URI"]
        .as_str()
        .unwrap()
        .contains("replicaSet=rs0"));
    // The dashboard: read-only, published on the host's loopback only.
    let web = &svc["web"];
    assert_eq!(web["command"][0].as_str(), Some("web"));
    assert!(
        !text.contains("--allow-actions\""),
        "the dashboard is read-only in compose"
    );
    assert!(web["ports"][0].as_str().unwrap().starts_with("127.0.0.1:"));
    // The Dockerfile copies what the build needs and runs the binary under tini.
    let docker = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    for needed in ["Cargo.toml", "Cargo.lock", "src", "schemas"] {
        assert!(
            docker.contains(&format!("COPY {needed}")) || docker.contains(&format!(" {needed} ")),
            "Dockerfile must copy {needed}"
        );
        assert!(std::path::Path::new(&format!("{root}/{needed}")).exists());
    }
    assert!(docker.contains("cargo build --release --locked --bin slotpool"));
    assert!(docker.contains("ENTRYPOINT [\"/usr/bin/tini\""));
    // Validate with a compose client when one is installed (no engine is needed).
    let tries: [&[&str]; 2] = [&["docker", "compose"], &["docker-compose"]];
    for t in tries {
        let works = Command::new(t[0])
            .args(&t[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !works {
            continue;
        }
        let out = Command::new(t[0])
            .args(&t[1..])
            .args(["-f", &format!("{root}/compose.yaml"), "config", "--quiet"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} config rejected compose.yaml: {}",
            t.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("validated compose.yaml with {}", t.join(" "));
        return;
    }
    println!("no compose client installed: compose.yaml checked structurally only");
}
