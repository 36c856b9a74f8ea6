//! Hostile text from documents and robots: control characters in robot names are
//! refused at create, and whatever gets in anyway (a hand-inserted document, a
//! robot's own output) reaches neither a terminal nor the log raw.

mod common;

use std::time::Duration;

use bson::doc;
use common::TestDb;

/// Raw bytes a terminal would act on, or that would start a forged log line.
fn raw_controls(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.chars().any(|c| c.is_control() || c == '\u{202e}'))
        .map(|l| format!("{l:?}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn control_characters_are_refused_at_create_and_escaped_everywhere_else() {
    let db = TestDb::new("hostile").await;
    db.init(1).await;
    for evil in [
        "evil\u{1b}[2J",
        "bell\u{7}",
        "cr\rline",
        "rtl\u{202e}gpj.exe",
        " padded",
    ] {
        let out = db.cli(&["robot", "create", "--name", evil, "--kind", "counter"]);
        assert!(!out.status.success(), "{evil:?} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--name"), "{evil:?}: {err}");
        assert!(
            raw_controls(&err).is_empty(),
            "the error echoes it raw: {err:?}"
        );
    }
    assert!(db.robots().await.is_empty(), "nothing was created");

    // Someone with write access inserts one anyway, as an exec robot that prints
    // escape sequences and a carriage return of its own.
    let name = "x\u{1b}[31mred\r\nFORGED worker line\u{202e}";
    let script = db.dir.join("noisy.sh");
    std::fs::write(
        &script,
        "#!/usr/bin/env bash\nprintf 'out\\033[2J\\rFORGED output line\\n'\nexec /nonexistent/next\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    db.insert_exec_by_hand(name, doc! {"command": script.to_string_lossy().to_string()})
        .await;
    let w = db.exec_worker(&[]);
    common::wait_for(
        Duration::from_secs(20),
        "the robot to crash and restart",
        || async {
            let r = db.robot(name).await;
            (r.get_i64("restarts").unwrap_or(0) >= 1).then_some(())
        },
    )
    .await;
    w.wait_log("FORGED output line", Duration::from_secs(10))
        .await;
    let log = w.log_text();
    assert!(
        raw_controls(&log).is_empty(),
        "raw control characters in the log: {:?}",
        raw_controls(&log)
    );
    for l in log.lines() {
        assert!(!l.starts_with("FORGED"), "a forged log line: {l:?}");
    }
    assert!(log.contains("\\u{1b}"), "escaped, not dropped");
    for args in [
        vec!["robot", "list"],
        vec!["robot", "list", "--json"],
        vec!["robot", "show", name],
        vec!["status"],
        vec!["status", "--json"],
        vec!["slots", "list"],
    ] {
        let out = db.cli(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            raw_controls(&text).is_empty(),
            "{args:?} printed it raw: {:?}",
            raw_controls(&text)
        );
    }
    let list = db.cli_ok(&["robot", "list"]);
    assert!(list.contains("x\\u{1b}[31mred\\u{d}\\u{a}FORGED"), "{list}");
    let json: serde_json::Value =
        serde_json::from_str(&db.cli_ok(&["robot", "list", "--json"])).unwrap();
    assert_eq!(json["robots"][0]["name"], name, "JSON keeps the real name");
}
