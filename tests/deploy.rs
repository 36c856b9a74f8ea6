//! `deploy/`: the Prometheus alert rules and the Grafana dashboard name only metrics
//! the worker exports, the rules pass `promtool` (check and unit tests) where it is
//! installed, and the dashboard is well-formed; the Kubernetes manifests pass the
//! Kubernetes schemas strictly, and hold the rules their comments state. (The
//! worker container, run as its Deployment declares it, is in tests/containers.rs.)

mod common;

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

#[test]
fn the_kubernetes_manifests_pass_the_kubernetes_schemas_strictly() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{root}/scripts/kube-validate.sh"))
        .output()
        .expect("run scripts/kube-validate.sh");
    assert!(
        out.status.success(),
        "scripts/kube-validate.sh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_kustomization_applies_every_manifest() {
    use common::kubernetes::{files, objects};
    let files = files();
    let k: serde_yaml::Value = serde_yaml::from_str(&files["kustomization.yaml"]).unwrap();
    let listed: BTreeSet<String> = k["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = files
        .keys()
        .filter(|f| *f != "kustomization.yaml")
        .cloned()
        .collect();
    assert_eq!(
        listed, present,
        "kustomization.yaml lists every manifest, and only those"
    );
    // Every object lives in the kustomization's namespace (set there, not per file),
    // and none carries a credential: the Secrets are made by the operator.
    assert_eq!(k["namespace"].as_str(), Some("slotpool"));
    for (file, text) in files.iter().filter(|(f, _)| *f != "kustomization.yaml") {
        for o in objects(text) {
            assert!(
                o["metadata"].get("namespace").is_none(),
                "{file}: namespace set in the file"
            );
            assert_ne!(
                o["kind"].as_str(),
                Some("Secret"),
                "{file}: a Secret in the repository"
            );
        }
    }
}

#[test]
fn the_worker_deployment_follows_the_tick() {
    use common::kubernetes::{declared, object, str_at};
    let w = declared("Deployment", "slotpool-worker", "10.0.0.7");
    let env = |k: &str| {
        w.env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("the worker has no {k}"))
    };
    // Its identity is the pod's address, on the port it serves and is scraped on.
    assert_eq!(env("SLOTPOOL_ADVERTISE"), format!("10.0.0.7:{}", w.port));
    let tick = humantime::parse_duration(&env("SLOTPOOL_TICK")).unwrap();
    let d = object("Deployment", "slotpool-worker");
    let annotations = &d["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"].as_str(), Some("true"));
    assert_eq!(
        annotations["prometheus.io/port"].as_str(),
        Some(w.port.to_string().as_str())
    );
    assert_eq!(annotations["prometheus.io/path"].as_str(), Some("/metrics"));
    // The grace covers a graceful handoff even with the database gone: the robots'
    // stop (0.3 T), a round already under way, the release, its event and the
    // heartbeat's removal, each database call giving up after max(2 T, 2 s).
    let call = (2 * tick).max(std::time::Duration::from_secs(2));
    let handoff = tick.mul_f64(0.3) + 8 * call + std::time::Duration::from_secs(1);
    assert!(
        std::time::Duration::from_secs(w.grace_seconds as u64) >= handoff,
        "terminationGracePeriodSeconds {} does not cover {handoff:?}",
        w.grace_seconds
    );
    // Readiness is the database's answer, liveness the worker's own loop; the
    // liveness probe gives the loop its full time before it counts as stuck.
    let (ready, live) = (w.readiness.clone().unwrap(), w.liveness.clone().unwrap());
    assert_eq!(ready.path.as_deref(), Some("/healthz"));
    assert_eq!(live.path.as_deref(), Some("/livez"));
    assert!(ready.period_seconds as f64 <= 2.0 * tick.as_secs_f64().max(1.0));
    assert!(
        live.timeout_seconds >= 2,
        "a loaded worker may answer slowly"
    );
    // The URI comes as a file from the Secret, never as a variable.
    assert!(w.env.iter().all(|(k, _)| k != "MONGODB_URI"));
    let file = env("MONGODB_URI_FILE");
    let (volume, path, read_only) = w
        .mounts
        .iter()
        .find(|(_, p, _)| file.starts_with(&format!("{p}/")))
        .expect("MONGODB_URI_FILE is on a mounted volume");
    assert!(read_only, "{path} is mounted read-only");
    let (secret, mode) = &w.secret_volumes[volume];
    assert_eq!(secret, "slotpool-mongodb");
    assert_eq!(mode & 0o007, 0, "the URI file is not world-readable");
    assert!(
        w.fs_group.is_some() && mode & 0o040 != 0,
        "the worker's group may read it"
    );
    // Locked down, and no API token for a robot to find.
    assert!(w.read_only_root && w.no_new_privileges && w.drop_all_capabilities);
    assert!(w.user != 0);
    assert_eq!(
        d["spec"]["template"]["spec"]["automountServiceAccountToken"].as_bool(),
        Some(false)
    );
    // Rolling updates add a standby before they stop a worker.
    assert_eq!(
        str_at(&d, &["spec", "strategy", "type"]),
        Some("RollingUpdate")
    );
    assert_eq!(
        d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"].as_i64(),
        Some(0)
    );
    // The disruption budget selects exactly the workers.
    let pdb = object("PodDisruptionBudget", "slotpool-worker");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(pdb["spec"]["maxUnavailable"].as_i64(), Some(1));
}

#[test]
fn kubernetes_env_references_expand_as_kubernetes_does() {
    use common::kubernetes::expand;
    let env = vec![("POD_IP".to_string(), "10.1.2.3".to_string())];
    assert_eq!(expand("$(POD_IP):7700", &env), "10.1.2.3:7700");
    assert_eq!(expand("$$(POD_IP)", &env), "$(POD_IP)");
    assert_eq!(expand("$(NOPE)x", &env), "$(NOPE)x");
    assert_eq!(expand("a$b", &env), "a$b");
    assert_eq!(expand("$(POD_IP", &env), "$(POD_IP");
}

#[test]
fn the_robot_isolation_patch_gives_a_valid_worker_whose_robots_run_as_another_user() {
    use common::kubernetes::{declared_in, merge, object, patch};
    let mut worker = object("Deployment", "slotpool-worker");
    merge(&mut worker, &patch("robots-as-another-user.yaml"));
    // The patched Deployment passes the schemas as strictly as the files do.
    let file = std::env::temp_dir().join(format!("spt-patched-worker-{}.yaml", std::process::id()));
    std::fs::write(&file, serde_yaml::to_string(&worker).unwrap()).unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{root}/scripts/kube-validate.sh"))
        .arg(&file)
        .output()
        .expect("run scripts/kube-validate.sh");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "the patched worker: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let w = declared_in(&worker, "10.0.0.7");
    assert_eq!((w.user, w.group, w.fs_group), (0, 0, None));
    let exec_user = w
        .env
        .iter()
        .find(|(k, _)| k == "SLOTPOOL_EXEC_USER")
        .map(|(_, v)| v.as_str());
    assert_eq!(
        exec_user,
        Some("10001:10001"),
        "robots get a user of their own"
    );
    assert!(w.drop_all_capabilities);
    let mut caps = w.cap_add.clone();
    caps.sort();
    assert_eq!(
        caps,
        ["KILL", "SETGID", "SETUID"],
        "only what starting and stopping robots needs"
    );
    assert_eq!(
        w.secret_volumes["mongodb-uri"].1, 0o400,
        "the URI file is root's alone"
    );
    // The rest of the worker is as before: same identity, probes and env.
    let plain = common::kubernetes::declared("Deployment", "slotpool-worker", "10.0.0.7");
    for (k, v) in &plain.env {
        assert!(w.env.contains(&(k.clone(), v.clone())), "{k} kept");
    }
    assert_eq!(w.args, plain.args);
    assert!(w.read_only_root && w.no_new_privileges);
}

#[test]
fn every_pod_is_locked_down_and_the_network_policies_select_the_pods_they_name() {
    use common::kubernetes::{declared, object};
    for (kind, name) in [
        ("Deployment", "slotpool-worker"),
        ("Deployment", "slotpool-web"),
        ("Job", "slotpool-init"),
    ] {
        let c = declared(kind, name, "10.0.0.7");
        assert!(
            c.read_only_root && c.no_new_privileges && c.drop_all_capabilities && c.user != 0,
            "{kind} {name} is not locked down: {c:?}"
        );
        assert!(c.cap_add.is_empty(), "{kind} {name} adds capabilities");
        let pod = &object(kind, name)["spec"]["template"]["spec"];
        assert_eq!(
            pod["automountServiceAccountToken"].as_bool(),
            Some(false),
            "{name}"
        );
        assert_eq!(
            pod["securityContext"]["runAsNonRoot"].as_bool(),
            Some(true),
            "{name}"
        );
    }
    for (policy, deployment) in [
        ("slotpool-worker", "slotpool-worker"),
        ("slotpool-web", "slotpool-web"),
    ] {
        let p = object("NetworkPolicy", policy);
        let d = object("Deployment", deployment);
        assert_eq!(
            p["spec"]["podSelector"]["matchLabels"], d["spec"]["selector"]["matchLabels"],
            "{policy} selects the pods of {deployment}"
        );
        let port = declared("Deployment", deployment, "10.0.0.7").port;
        let allowed: Vec<u64> = p["spec"]["ingress"]
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|r| r["ports"].as_sequence().cloned().unwrap_or_default())
            .filter_map(|x| x["port"].as_u64())
            .collect();
        assert_eq!(
            allowed,
            [port as u64],
            "{policy} opens only the container's port"
        );
    }
    // Workers reach each other (pokes); nothing else in the cluster reaches the
    // dashboard unless labelled for it.
    let w = object("NetworkPolicy", "slotpool-worker");
    let from = &w["spec"]["ingress"][0]["from"];
    assert!(from
        .as_sequence()
        .unwrap()
        .iter()
        .any(
            |f| f["podSelector"]["matchLabels"]["app.kubernetes.io/component"].as_str()
                == Some("worker")
                && f.get("namespaceSelector").is_none()
        ));
    let web = object("NetworkPolicy", "slotpool-web");
    for f in web["spec"]["ingress"][0]["from"].as_sequence().unwrap() {
        assert!(
            f["podSelector"]["matchLabels"]["slotpool/dashboard-client"].as_str() == Some("true"),
            "the dashboard is open to {f:?}"
        );
    }
}
