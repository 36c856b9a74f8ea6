//! deploy/kubernetes/ as the tests read it: every object of every manifest, and the
//! worker's container as its Deployment declares it, with Kubernetes' own rules for
//! what a container gets (`$(VAR)` references in env values, the pod's security
//! context under the container's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml::Value;

pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Every `*.yaml` file of the directory, by name.
pub fn files() -> BTreeMap<String, String> {
    std::fs::read_dir(dir())
        .expect("deploy/kubernetes")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The objects of one file (a file may hold several, `---` apart).
pub fn objects(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("well-formed YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The object of `kind` named `name`, from any manifest.
pub fn object(kind: &str, name: &str) -> Value {
    files()
        .values()
        .flat_map(|t| objects(t))
        .find(|o| {
            str_at(o, &["kind"]) == Some(kind) && str_at(o, &["metadata", "name"]) == Some(name)
        })
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path)?.as_str()
}

pub fn int_at(v: &Value, path: &[&str]) -> Option<i64> {
    at(v, path)?.as_i64()
}

/// A pod template's one container as it would run.
#[derive(Debug, Clone)]
pub struct DeclaredContainer {
    pub args: Vec<String>,
    /// Env in order, with the values Kubernetes would give: `fieldRef: status.podIP`
    /// from `pod_ip`, `$(NAME)` expanded from the variables before it. A value from a
    /// Secret is left out (the caller supplies the Secret its own way).
    pub env: Vec<(String, String)>,
    /// Env names whose value a Secret gives: (name, secret, key).
    pub env_from_secrets: Vec<(String, String, String)>,
    pub user: i64,
    pub group: i64,
    /// The pod's fsGroup: a supplementary group of the container's process, and the
    /// group of a Secret's files.
    pub fs_group: Option<i64>,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub drop_all_capabilities: bool,
    /// Capabilities added back (after dropping them all).
    pub cap_add: Vec<String>,
    /// (volume name, mount path, read only).
    pub mounts: Vec<(String, String, bool)>,
    /// Volume name → the Secret it shows, and the files' mode.
    pub secret_volumes: BTreeMap<String, (String, u32)>,
    /// Volume names that are `emptyDir`s.
    pub empty_dirs: Vec<String>,
    pub readiness: Option<Probe>,
    pub liveness: Option<Probe>,
    pub grace_seconds: i64,
    pub port: u16,
}

/// An httpGet or tcpSocket probe: path None for a TCP probe.
#[derive(Debug, Clone)]
pub struct Probe {
    pub path: Option<String>,
    pub port: u16,
    pub period_seconds: i64,
    pub timeout_seconds: i64,
    pub failure_threshold: i64,
}

/// The container of the `kind` (Deployment or Job) `name`, with the pod at `pod_ip`.
pub fn declared(kind: &str, name: &str, pod_ip: &str) -> DeclaredContainer {
    declared_in(&object(kind, name), pod_ip)
}

/// `deploy/kubernetes/patches/FILE`, as written.
pub fn patch(file: &str) -> Value {
    let text = std::fs::read_to_string(dir().join("patches").join(file)).expect("the patch");
    serde_yaml::from_str(&text).expect("well-formed YAML")
}

/// A strategic merge patch as kustomize applies these: maps merge key by key, a
/// `null` deletes its key, a list of objects that all have a `name` (containers,
/// env, volumes, volumeMounts, ports) merges item by item on it, and any other list
/// (capabilities, args) is replaced.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Mapping(b), Value::Mapping(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else if let Some(old) = b.get_mut(k) {
                    merge(old, v);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        (Value::Sequence(b), Value::Sequence(p)) if named(b) && named(p) => {
            for item in p {
                match b.iter_mut().find(|x| x["name"] == item["name"]) {
                    Some(old) => merge(old, item),
                    None => b.push(item.clone()),
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn named(list: &[Value]) -> bool {
    !list.is_empty()
        && list
            .iter()
            .all(|x| x.get("name").is_some_and(Value::is_string))
}

/// The container of `workload` (a Deployment or Job object), with the pod at `pod_ip`.
pub fn declared_in(workload: &Value, pod_ip: &str) -> DeclaredContainer {
    let pod = at(workload, &["spec", "template", "spec"]).expect("a pod template");
    let containers = pod["containers"].as_sequence().expect("containers");
    let name = str_at(workload, &["metadata", "name"]).unwrap_or("?");
    assert_eq!(containers.len(), 1, "{name}: one container");
    let c = &containers[0];
    let ports: BTreeMap<String, u16> = c["ports"]
        .as_sequence()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or("").to_string(),
                        p["containerPort"].as_u64().unwrap() as u16,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let port_of = |v: &Value| -> u16 {
        match v {
            Value::String(s) => *ports.get(s).unwrap_or_else(|| panic!("no port named {s}")),
            v => v.as_u64().expect("a port") as u16,
        }
    };
    let probe = |key: &str| -> Option<Probe> {
        let p = c.get(key)?;
        let (path, port) = if let Some(h) = p.get("httpGet") {
            (
                Some(h["path"].as_str().unwrap().to_string()),
                port_of(&h["port"]),
            )
        } else {
            (None, port_of(&p["tcpSocket"]["port"]))
        };
        Some(Probe {
            path,
            port,
            // Kubernetes' defaults where a field is left out.
            period_seconds: p["periodSeconds"].as_i64().unwrap_or(10),
            timeout_seconds: p["timeoutSeconds"].as_i64().unwrap_or(1),
            failure_threshold: p["failureThreshold"].as_i64().unwrap_or(3),
        })
    };
    let mut env: Vec<(String, String)> = Vec::new();
    let mut env_from_secrets = Vec::new();
    for e in c["env"].as_sequence().into_iter().flatten() {
        let key = e["name"].as_str().unwrap().to_string();
        if let Some(v) = e["value"].as_str() {
            let value = expand(v, &env);
            env.push((key, value));
        } else if let Some(f) = str_at(e, &["valueFrom", "fieldRef", "fieldPath"]) {
            assert_eq!(f, "status.podIP", "{key}: only the pod IP is emulated");
            env.push((key, pod_ip.to_string()));
        } else if let Some(s) = at(e, &["valueFrom", "secretKeyRef"]) {
            env_from_secrets.push((
                key,
                s["name"].as_str().unwrap().to_string(),
                s["key"].as_str().unwrap().to_string(),
            ));
        } else {
            panic!("{key}: a kind of env value the tests do not emulate: {e:?}");
        }
    }
    let sc = |k: &str| at(c, &["securityContext", k]).or_else(|| at(pod, &["securityContext", k]));
    let mut secret_volumes = BTreeMap::new();
    let mut empty_dirs = Vec::new();
    for v in pod["volumes"].as_sequence().into_iter().flatten() {
        let vname = v["name"].as_str().unwrap().to_string();
        if let Some(s) = v.get("secret") {
            // Kubernetes' default when it is left out.
            let mode = match s.get("defaultMode") {
                None => 0o644,
                Some(m) => m
                    .as_u64()
                    .unwrap_or_else(|| panic!("{vname}: defaultMode {m:?} is not a number"))
                    as u32,
            };
            secret_volumes.insert(vname, (s["secretName"].as_str().unwrap().to_string(), mode));
        } else if v.get("emptyDir").is_some() {
            empty_dirs.push(vname);
        }
    }
    DeclaredContainer {
        args: c["args"]
            .as_sequence()
            .map(|a| {
                a.iter()
                    .map(|x| expand(x.as_str().unwrap(), &env))
                    .collect()
            })
            .unwrap_or_default(),
        env,
        env_from_secrets,
        user: sc("runAsUser").and_then(Value::as_i64).expect("runAsUser"),
        group: sc("runAsGroup")
            .and_then(Value::as_i64)
            .expect("runAsGroup"),
        fs_group: at(pod, &["securityContext", "fsGroup"]).and_then(Value::as_i64),
        read_only_root: sc("readOnlyRootFilesystem").and_then(Value::as_bool) == Some(true),
        no_new_privileges: sc("allowPrivilegeEscalation").and_then(Value::as_bool) == Some(false),
        drop_all_capabilities: at(c, &["securityContext", "capabilities", "drop"])
            .and_then(Value::as_sequence)
            .is_some_and(|d| d.iter().any(|x| x.as_str() == Some("ALL"))),
        cap_add: at(c, &["securityContext", "capabilities", "add"])
            .and_then(Value::as_sequence)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        mounts: c["volumeMounts"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|m| {
                (
                    m["name"].as_str().unwrap().to_string(),
                    m["mountPath"].as_str().unwrap().to_string(),
                    m["readOnly"].as_bool().unwrap_or(false),
                )
            })
            .collect(),
        secret_volumes,
        empty_dirs,
        readiness: probe("readinessProbe"),
        liveness: probe("livenessProbe"),
        grace_seconds: pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30),
        port: ports.values().next().copied().unwrap_or(0),
    }
}

/// Kubernetes' `$(NAME)` expansion in env values and args: a variable defined
/// earlier is replaced, `$$` is a literal `$`, anything else stays as written.
pub fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(body) = tail.strip_prefix("$(") {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => out.push_str(&tail[..end + 3]),
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str(tail);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}
