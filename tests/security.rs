//! Security, tried as an attacker would: `exec` is off until allowed, `spec.env`
//! cannot get around `--exec-allow`, a robot cannot recover the database's
//! credentials from `/proc` or inherited descriptors, and no credential-bearing part
//! of a URI is ever printed. Real workers, the real dev server, real `/proc` reads.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bson::{doc, oid::ObjectId, Document};
use common::script;
use common::{TestDb, WorkerProc};

/// Waits until robot `name` has status `status`; returns its document.
async fn robot_in(db: &TestDb, name: &str, status: &str) -> Document {
    common::wait_for(
        Duration::from_secs(20),
        &format!("robot {name} to be {status}"),
        || async {
            let r = db.robot(name).await;
            (r.get_str("status").unwrap_or("") == status).then_some(r)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_robots_do_not_run_until_a_worker_allows_them() {
    let db = TestDb::new("execoff").await;
    db.init(1).await;
    let marker = db.dir.join("ran");
    let cmd = script(
        &db,
        "r.sh",
        &format!("touch '{}'\nsleep 30\n", marker.display()),
    );
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "r",
        "--kind",
        "exec",
        "--command",
        &cmd,
    ]);
    let _w = db.worker(&[]);
    let r = robot_in(&db, "r", "failed").await;
    let error = r.get_str("error").unwrap();
    assert!(
        error.contains("exec robots are disabled on this worker") && error.contains("--exec-allow"),
        "{r}"
    );
    assert!(
        !marker.exists(),
        "the command ran on a worker without --exec-allow"
    );
    // `status` says why the robot is not running.
    let status = db.cli_ok(&["status"]);
    assert!(status.contains("exec robots are disabled"), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spec_env_cannot_get_around_the_exec_allow_list() {
    let db = TestDb::new("execenv").await;
    db.init(1).await;
    let pwned = |what: &str| db.dir.join(format!("pwned-{what}"));
    // The one allowed program: a plain bash robot that echoes and checkpoints.
    let allowed = script(
        &db,
        "allowed.sh",
        "echo \"started\"\necho \"{\\\"checkpoint\\\": {\\\"greeting\\\": \\\"${GREETING:-unset}\\\"}}\"\nsleep 30 & wait $!\n",
    );
    // A program found through PATH under the bare name the worker allows.
    std::fs::create_dir_all(db.dir.join("evil")).unwrap();
    let evil = db.dir.join("evil/helper");
    std::fs::write(
        &evil,
        format!("#!/bin/sh\ntouch '{}'\n", pwned("path").display()),
    )
    .unwrap();
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();

    let attacks: [(&str, &str, Document); 3] = [
        (
            "func",
            &allowed,
            doc! {"BASH_FUNC_echo%%": format!("() {{ touch '{}'; }}", pwned("func").display())},
        ),
        (
            "bashenv",
            &allowed,
            doc! {"BASH_ENV": format!("$(touch '{}')", pwned("bashenv").display())},
        ),
        (
            "path",
            "helper",
            doc! {"PATH": db.dir.join("evil").to_string_lossy().into_owned()},
        ),
    ];
    for (name, command, env) in &attacks {
        db.insert_exec_by_hand(name, doc! {"command": *command, "env": env.clone()})
            .await;
    }
    // Allowed by name, and one the worker does not allow.
    db.insert_exec_by_hand(
        "greeter",
        doc! {"command": &allowed, "env": {"GREETING": "hello"}},
    )
    .await;
    db.insert_exec_by_hand("other", doc! {"command": &allowed, "env": {"OTHER": "x"}})
        .await;

    let _w = db.worker(&[
        "--exec-allow",
        &format!("{allowed},helper"),
        "--exec-env-allow",
        "GREETING",
    ]);
    // The allowed variable reaches the program: robots do run here.
    common::wait_for(
        Duration::from_secs(20),
        "the greeter to checkpoint",
        || async {
            let r = db.robot("greeter").await;
            (r.get_document("context").ok()?.get_str("greeting").ok()? == "hello").then_some(())
        },
    )
    .await;
    for (name, _, env) in &attacks {
        let r = robot_in(&db, name, "failed").await;
        let error = r.get_str("error").unwrap();
        let var = env.keys().next().unwrap();
        assert!(
            error.contains("is refused") && error.contains(var.trim_end_matches('%')),
            "{name}: {r}"
        );
    }
    let other = robot_in(&db, "other", "failed").await;
    assert!(
        other
            .get_str("error")
            .unwrap()
            .contains("--exec-env-allow OTHER"),
        "{other}"
    );
    for (name, _, _) in &attacks {
        assert!(!pwned(name).exists(), "attack {name} ran code");
    }

    // Nor can an operator allow one of those variables by mistake.
    let mut bad = db.worker(&["--exec-allow", &allowed, "--exec-env-allow", "LD_PRELOAD"]);
    let status = bad
        .wait_exit(Duration::from_secs(10))
        .expect("refused at start");
    assert!(!status.success());
    let log = bad.log_text();
    assert!(
        log.contains("--exec-env-allow LD_PRELOAD") && log.contains("load or interpret code"),
        "{log}"
    );

    // `robot create` refuses them up front, before any worker sees them.
    let out = db.cli(&[
        "robot",
        "create",
        "--name",
        "x",
        "--kind",
        "exec",
        "--spec",
        r#"{"command": "/bin/true", "env": {"LD_PRELOAD": "/tmp/x.so"}}"#,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("LD_PRELOAD is refused"));
}

/// Everything an attacker robot can read about its ancestors and itself.
const LOOTER: &str = r#"
out="$LOOT_DIR/loot-$$.txt"
{
  echo "== own environ"; tr '\0' '\n' < /proc/self/environ
  echo "== own fds"; for f in /proc/$$/fd/*; do echo "$f -> $(readlink "$f")"; done
  p=$$
  for level in shim worker; do
    p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2)
    echo "== $level $p cmdline"; tr '\0' ' ' < /proc/$p/cmdline; echo
    echo "== $level $p environ"; tr '\0' '\n' < /proc/$p/environ 2>&1
    echo "== $level $p fds"; ls -l /proc/$p/fd 2>&1
    echo "== $level $p maps"; head -2 /proc/$p/maps 2>&1
    # Every writable mapping (the heap, thread arenas) through /proc/PID/mem.
    grep ' rw-p ' /proc/$p/maps 2>/dev/null | while read -r range _; do
      s=$((16#${range%-*})); e=$((16#${range#*-})); n=$(( (e - s) / 4096 ))
      [ "$n" -le 16384 ] && dd if=/proc/$p/mem bs=4096 skip=$((s / 4096)) count=$n 2>/dev/null
    done > "$LOOT_DIR/mem-$level-$$.bin"
  done
  # Speak for its shim: the report pipe the shim holds as descriptor 4.
  if echo '"memory_killed"' > /proc/$PPID/fd/4; then echo "== forge: written"; else echo "== forge: refused"; fi
} > "$out.part" 2>&1
mv "$out.part" "$out"
echo '{"checkpoint": {"looted": true}}'
while true; do sleep 1 & wait $!; done
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_robot_cannot_recover_the_database_credentials() {
    let db = TestDb::new("creds").await;
    db.init(2).await;
    // A real user on the server, and a URI that authenticates as it.
    let user = format!("u_{}", db.name);
    let password = format!("Pw-{}", ObjectId::new().to_hex());
    db.store
        .client()
        .database("admin")
        .run_command(doc! {"createUser": &user, "pwd": &password, "roles": ["root"]})
        .await
        .expect("create a user");
    let (scheme, rest) = db.uri.split_once("://").unwrap();
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let sep = if rest.contains('?') { '&' } else { '?' };
    let secret_uri = format!("{scheme}://{user}:{password}@{rest}{sep}authSource=admin");

    let looter = script(
        &db,
        "looter.sh",
        &format!("LOOT_DIR='{}'\n{LOOTER}", db.dir.display()),
    );
    for name in ["loot-a", "loot-b"] {
        db.exec(name, &looter, &[]);
    }
    let allow = db.exec_allow();
    // One worker gets the URI in its environment, the other on its command line.
    let by_env = WorkerProc::start(&secret_uri, &db.dir, &["--exec-allow", &allow]);
    let by_flag = WorkerProc::start_uri_flag(&secret_uri, &db.dir, &["--exec-allow", &allow]);
    common::wait_for(Duration::from_secs(30), "both robots to loot", || async {
        let looted = db
            .robots()
            .await
            .iter()
            .filter(|r| {
                r.get_document("context")
                    .is_ok_and(|c| c.get_bool("looted").unwrap_or(false))
            })
            .count();
        (looted == 2).then_some(())
    })
    .await;
    let loot: Vec<String> = std::fs::read_dir(&db.dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            let n = p.file_name()?.to_str()?.to_string();
            (n.starts_with("loot-") && n.ends_with(".txt"))
                .then(|| std::fs::read_to_string(p).unwrap())
        })
        .collect();
    assert!(loot.len() >= 2, "looted {} times", loot.len());
    let mut saw_flag = false;
    for text in &loot {
        // The attack reached the worker's process...
        assert!(text.contains(" worker --advertise"), "{text}");
        saw_flag |= text.contains("--mongodb-uri");
        // ...and found nothing.
        assert!(
            !text.contains(&password) && !text.contains(&user),
            "the credentials leaked:\n{text}"
        );
        assert!(
            text.contains("== forge: refused"),
            "a robot wrote on its shim's report pipe:\n{text}"
        );
        let own_fds = text
            .split("== own fds")
            .nth(1)
            .and_then(|t| t.split("== shim").next())
            .unwrap();
        assert!(
            !own_fds.contains("socket:"),
            "inherited a socket:\n{own_fds}"
        );
    }
    assert!(
        saw_flag,
        "one robot ran under the worker with --mongodb-uri"
    );
    // Nor in the memory of any process it could read.
    for e in std::fs::read_dir(&db.dir).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap().to_string_lossy().starts_with("mem-") {
            let bytes = std::fs::read(&p).unwrap();
            let found = bytes
                .windows(password.len())
                .any(|w| w == password.as_bytes());
            assert!(
                !found,
                "the password is readable in {} ({} bytes)",
                p.display(),
                bytes.len()
            );
        }
    }
    // Nor do the workers print it: not in their logs, not on /status.
    for w in [&by_env, &by_flag] {
        let (_, status) = w.http_get("/status").expect("/status answers");
        assert!(!status.contains(&password) && !w.log_text().contains(&password));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_part_of_a_uri_that_carries_a_credential_is_printed() {
    let db = TestDb::new("redact").await;
    let cases = [
        (
            "mongodb://127.0.0.1:1/x?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:Tok3nSecretValue&serverSelectionTimeoutMS=300",
            "Tok3nSecretValue",
        ),
        (
            "mongodb://127.0.0.1:1/x?tls=true&tlsCertificateKeyFilePassword=KeyPwS3cretValue",
            "KeyPwS3cretValue",
        ),
        ("mongodb://alice:pa/ssS3cretValue@127.0.0.1:1/x", "ssS3cretValue"),
        ("mongodb://alice:p%40ssS3cretValue@127.0.0.1:1/x?serverSelectionTimeoutMS=300", "ssS3cretValue"),
        ("alice:NoSchemeS3cret@127.0.0.1", "NoSchemeS3cret"),
    ];
    for (uri, secret) in cases {
        for args in [&["status"][..], &["worker", "--listen", "127.0.0.1:0"][..]] {
            let out = std::process::Command::new(common::BIN)
                .args(args)
                .env("MONGODB_URI", uri)
                .env("SLOTPOOL_LOG", "debug")
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.status.success(), "{args:?} with {uri}: {text}");
            assert!(text.contains("error"), "{text}");
            assert!(!text.contains(secret), "{args:?} printed {secret}:\n{text}");
        }
    }
    // From a file, as Docker secrets are mounted; a bad file is a clear error.
    let file = db.dir.join("uri");
    std::fs::write(&file, format!("{}\n", db.uri)).unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["status"])
        .env_remove("MONGODB_URI")
        .env("MONGODB_URI_FILE", &file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(common::BIN)
        .args(["status", "--mongodb-uri-file", "/nonexistent/uri"])
        .env("MONGODB_URI", &db.uri)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("give only one"),
        "{err}"
    );
    let out = std::process::Command::new(common::BIN)
        .args(["status", "--mongodb-uri-file", "/nonexistent/uri"])
        .env_remove("MONGODB_URI")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot read the MongoDB URI file /nonexistent/uri"),
        "{err}"
    );
}

/// Open descriptors of a process, when this test may look (it may not, for a
/// non-dumpable worker, unless it runs as root).
fn open_fds(pid: i32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

#[tokio::test(flavor = "multi_thread")]
async fn http_clients_cannot_starve_the_worker_or_its_robots() {
    // The flood below holds 1,000 sockets in this process: make room for them and
    // for the other tests running beside this one.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with an initialised struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    assert!(
        limit.rlim_cur >= 2048,
        "this test needs an open-file hard limit of at least 2048, not {}",
        limit.rlim_cur
    );
    let db = TestDb::new("httpflood").await;
    db.init(1).await;
    // A worker at a low descriptor limit, as under the common default of 1,024.
    let w = WorkerProc::start_nofile(&db.uri, &db.dir, &["--exec-allow", &db.exec_allow()], 256);
    common::wait_for(Duration::from_secs(15), "the slot to be held", || async {
        (common::owner(&db.slot("slot-001").await)? == w.id).then_some(())
    })
    .await;
    // Someone on the network opens connections and never sends a request, keeping
    // the newest 1,000 open, at about 500 a second.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let opened = std::sync::Arc::new(AtomicU64::new(0));
    let port = w.port;
    let flood = {
        let (stop, opened) = (stop.clone(), opened.clone());
        std::thread::spawn(move || {
            let mut held = std::collections::VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..25 {
                    if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                        held.push_back(s);
                        opened.fetch_add(1, Ordering::Relaxed);
                    }
                    if held.len() > 1000 {
                        held.pop_front();
                    }
                }
                // Pacing the attacker, not waiting for a condition.
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    common::wait_for(
        Duration::from_secs(30),
        "1,000 connections opened",
        || async { (opened.load(Ordering::Relaxed) > 1000).then_some(()) },
    )
    .await;
    // Robots still start: each needs descriptors of the worker's.
    let cmd = script(
        &db,
        "once.sh",
        "echo '{\"checkpoint\": {\"started\": true}}'\nexec sleep 60\n",
    );
    for i in 0..5 {
        db.cli_ok(&[
            "robot",
            "create",
            "--name",
            &format!("r{i}"),
            "--kind",
            "exec",
            "--command",
            &cmd,
        ]);
    }
    common::wait_for(
        Duration::from_secs(30),
        "all five robots to start",
        || async {
            let started = db
                .robots()
                .await
                .iter()
                .filter(|r| r.get_i64("seq").unwrap_or(0) >= 1)
                .count();
            (started == 5).then_some(())
        },
    )
    .await;
    // Health probes are answered throughout.
    for _ in 0..5 {
        common::wait_for(Duration::from_secs(10), "/healthz to answer", || async {
            (w.http_get("/healthz")?.0 == 200).then_some(())
        })
        .await;
    }
    if let Some(n) = open_fds(w.pid()) {
        assert!(n < 200, "the worker holds {n} descriptors");
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let log = w.log_text();
    assert!(!log.contains("Too many open files"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_allow_list_restricts_commands() {
    let db = TestDb::new("allow").await;
    db.init(1).await;
    let allowed_dir = db.dir.join("allowed");
    std::fs::create_dir_all(&allowed_dir).unwrap();
    let ok = allowed_dir.join("ok.sh");
    std::fs::write(
        &ok,
        "#!/bin/sh\necho '{\"checkpoint\": {\"hi\": 1}}'\nexec sleep 60\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o755)).unwrap();
    let allow = format!("{}/", allowed_dir.display());
    let _w = db.worker(&["--exec-allow", &allow]);
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "inside",
        "--kind",
        "exec",
        "--command",
        ok.to_str().unwrap(),
    ]);
    db.cli_ok(&[
        "robot",
        "create",
        "--name",
        "outside",
        "--kind",
        "exec",
        "--command",
        "/bin/sh",
        "--arg",
        "-c",
        "--arg",
        "echo pwned",
    ]);
    common::wait_for(
        Duration::from_secs(15),
        "the allowed robot to checkpoint and the other to be refused",
        || async {
            let inside = db.robot("inside").await.get_i64("seq").ok()? >= 1;
            let outside = db.robot("outside").await;
            let refused = outside.get_str("status").ok()? == "failed"
                && outside
                    .get_str("error")
                    .ok()?
                    .contains("not allowed by this worker's --exec-allow");
            (inside && refused).then_some(())
        },
    )
    .await;
    assert_eq!(db.robot("outside").await.get_i64("seq").unwrap(), 0);
}

/// A robot that, asked to stop, stops its own shim (SIGSTOP to its parent, which it
/// may signal: it runs as the worker's user here) and steps on. The shim then reads
/// neither the stop nor the kill; the worker waits it out and ends the run, and
/// must still see the robot dead before its next holder runs it: the shim is
/// continued, kills the tree on its closed pipe, or is killed itself. Its steps end
/// before the new copy's begin.
#[tokio::test(flavor = "multi_thread")]
async fn a_robot_that_stops_its_shim_at_its_stop_still_dies_before_it_runs_elsewhere() {
    let db = TestDb::new("stops_shim").await;
    db.init(1).await;
    let dir = db.dir.display();
    let cmd = script(
        &db,
        "stopper.sh",
        &format!(
            r#"trap 'kill -STOP $PPID' TERM
while true; do echo "$SLOTPOOL_EPOCH $$ $(date +%s%N)" >> {dir}/steps; sleep 0.1; done
"#
        ),
    );
    let mut first = db.exec_worker(&[]);
    common::wait_for(Duration::from_secs(20), "the slot held", || async {
        (common::owner(&db.slot("slot-001").await)? == first.id).then_some(())
    })
    .await;
    db.exec("s", &cmd, &[]);
    let epoch = common::epoch(&db.slot("slot-001").await);
    let old = common::wait_for(Duration::from_secs(20), "the robot stepping", || async {
        let s = common::stubborn_steps_under(&db, epoch);
        (s.len() >= 3).then(|| s[0].1)
    })
    .await;
    let second = db.exec_worker(&[]);
    common::wait_for(Duration::from_secs(20), "the standby answering", || async {
        second.http_get("/status").map(|_| ())
    })
    .await;
    first.signal(libc::SIGTERM);
    common::wait_for(Duration::from_secs(60), "the stopped copy dead", || async {
        (!common::alive(old)).then_some(())
    })
    .await;
    let new = common::wait_for(
        Duration::from_secs(60),
        "the next holder's copy stepping",
        || async {
            let s: Vec<_> = common::stubborn_steps(&db)
                .into_iter()
                .filter(|s| s.0 > epoch)
                .collect();
            (s.len() >= 3).then(|| s[0].2)
        },
    )
    .await;
    let last_old = common::stubborn_steps_of(&db, old, 0)
        .iter()
        .map(|s| s.2)
        .max()
        .unwrap();
    assert!(
        last_old < new,
        "the copy that stopped its shim stepped beside its next holder's"
    );
    let status = first
        .wait_exit(Duration::from_secs(30))
        .expect("the first worker exits");
    assert!(status.success(), "{status}");
}
