//! The CLI conventions of issue 15 on a real `turnstile dev`: `--json` prints every reply and every Watch
//! item in the protobuf JSON mapping (the same JSON any protobuf library prints for that message:
//! lowerCamelCase names, enum value names, 64-bit integers as strings, defaults left out), and
//! `turnstile completions SHELL` prints a completion script for bash, zsh and fish.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use turnstile_tests::DevServer;
use turnstile_tests::msg::TEST_TENANT;

/// Runs the CLI (against `url` when given) and returns (success, stdout, stderr).
async fn cli(url: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let mut all = Vec::new();
    if let Some(url) = url {
        all.extend(["--addr".to_owned(), url.to_owned(), "--tenant".to_owned(), TEST_TENANT.to_owned()]);
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let out = turnstile_tests::binary::run_cli(all).await;
    (out.success, out.stdout, out.stderr)
}

/// The one JSON line a command printed.
async fn json(url: &str, args: &[&str]) -> Value {
    let (ok, out, err) = cli(Some(url), args).await;
    assert!(ok, "turnstile {args:?} failed: {err}");
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test]
async fn json_prints_replies_and_watch_items_in_the_protobuf_mapping() {
    let server = DevServer::start().await.unwrap();
    let url = server.url();
    let s = format!("json-{}", uuid::Uuid::new_v4().simple());

    // A delivery: the SendReply plus the MessageId it sent; no turn for a non-waking one.
    let queued = json(&url, &["queue", &s, "hello", "--id", "m-1", "--json"]).await;
    assert_eq!(queued, serde_json::json!({"id": "m-1", "seq": "1"}));
    // The global flag goes before the command as well.
    let inbox = json(&url, &["--json", "inbox", &s]).await;
    assert_eq!(
        inbox,
        serde_json::json!({"seq": "1", "nextTurn": [{"id": "m-1", "content": [{"text": {"text": "hello"}}], "source": {"user": {}}}]})
    );
    let info = json(&url, &["session", &s, "--json"]).await;
    assert_eq!(info["status"], "SESSION_STATUS_IDLE");
    assert_eq!(info["lastSeq"], "1");
    assert_eq!(info["session"], serde_json::json!({"tenant": TEST_TENANT, "id": s}));
    assert_eq!(info["injectMode"], "INJECT_MODE_PENDING");

    let followed = json(&url, &["followup", &s, "go", "--json"]).await;
    assert_eq!(followed["seq"], "2");
    assert!(followed["turn"].is_string(), "a waking delivery opened a turn: {followed}");
    let idle = json(&url, &["wait-idle", &s, "--json"]).await;
    assert_eq!(idle["status"], "SESSION_STATUS_IDLE");

    // Watch: one WatchItem per line, each exactly one of event / live / caughtUp.
    let (ok, out, err) = cli(Some(&url), &["watch", &s, "--json", "--until-idle"]).await;
    assert!(ok, "{err}");
    let items: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for item in &items {
        let keys: Vec<&String> = item.as_object().unwrap().keys().collect();
        assert!(matches!(keys.as_slice(), [k] if ["event", "live", "caughtUp"].contains(&k.as_str())), "{item}");
    }
    let events: Vec<&Value> = items.iter().filter_map(|i| i.get("event")).collect();
    assert_eq!(events[0]["type"], "agent/inbox/spliced");
    assert_eq!(events[0]["inboxSpliced"]["target"], "TARGET_NEXT_TURN");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "every durable event, in order");
    let answers: Vec<&Value> = events.iter().filter_map(|e| e.get("assistantMessage")).map(|a| &a["text"]).collect();
    assert_eq!(answers, ["echo: hello", "echo: go"]);
    let caught_up = items.iter().find_map(|i| i.get("caughtUp")).expect("a caughtUp item");
    assert_eq!(caught_up["status"], "SESSION_STATUS_IDLE");

    // Edits and commands: their reply messages.
    let canceled = json(&url, &["cancel", &s, "--json"]).await;
    assert!(canceled["seq"].is_string(), "{canceled}");
    let (ok, out, _) = cli(Some(&url), &["list", "--json"]).await;
    assert!(ok);
    let listed: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(listed.iter().any(|i| i["session"]["id"] == s.as_str()), "{out}");
    // Errors stay on stderr, in the same words as without --json.
    let (ok, out, err) = cli(Some(&url), &["remove", &s, "nope", "--json"]).await;
    assert!(!ok);
    assert_eq!(out, "");
    assert!(err.starts_with("error: NOT_FOUND: "), "{err}");
}

#[tokio::test]
async fn completions_are_printed_for_bash_zsh_and_fish() {
    for (shell, marker) in [("bash", "_turnstile()"), ("zsh", "#compdef turnstile"), ("fish", "complete -c turnstile")]
    {
        let (ok, out, err) = cli(None, &["completions", shell]).await;
        assert!(ok, "{shell}: {err}");
        assert!(out.contains(marker), "{shell} script without {marker:?}");
        for command in ["followup", "steer", "watch", "completions"] {
            assert!(out.contains(command), "{shell} script does not complete {command}");
        }
    }
    let (ok, _, err) = cli(None, &["completions", "tcsh"]).await;
    assert!(!ok);
    assert!(err.contains("invalid value 'tcsh'"), "{err}");
}

/// The next durable event of `stream` for which `want` holds (bounded).
async fn wait_event(
    stream: &mut tonic::Streaming<turnstile_tests::v1::WatchItem>,
    what: &str,
    want: impl Fn(&turnstile_tests::v1::SessionEvent) -> bool,
) {
    use turnstile_tests::v1::watch_item::Item;
    let found = async {
        while let Some(item) = stream.message().await.unwrap() {
            if let Some(Item::Event(e)) = item.item
                && want(&e)
            {
                return;
            }
        }
        panic!("the Watch ended before {what}");
    };
    tokio::time::timeout(turnstile_tests::DEFAULT_WAIT, found).await.unwrap_or_else(|_| panic!("no {what}"));
}

/// `turnstile chat` driven through its stdin, as a person at a terminal would: a line is a followup whose
/// reply streams to stdout; a line while the agent runs is a steer; Ctrl-C (SIGINT) stops the running turn
/// keeping the inbox, so the steer runs with the next line; end of input ends the chat once idle.
#[tokio::test]
async fn chat_sends_lines_streams_replies_and_maps_ctrl_c_to_interrupt() {
    use std::io::{BufRead as _, Write as _};
    use turnstile_tests::v1::session_event::Payload;
    use turnstile_tests::v1::{SessionRef, WatchRequest, turn_end_reason::Reason};

    let server = DevServer::start().await.unwrap();
    let id = format!("chat-{}", uuid::Uuid::new_v4().simple());
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    let mut child = std::process::Command::new(bin)
        .args(["--addr", &server.url(), "--tenant", TEST_TENANT, "chat", &id])
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let mut printed = Vec::new();
    let mut wait_line = async |want: &str, printed: &mut Vec<String>| {
        let found = async {
            while let Some(line) = lines.recv().await {
                printed.push(line.clone());
                if line == want {
                    return;
                }
            }
        };
        tokio::time::timeout(turnstile_tests::DEFAULT_WAIT, found).await.unwrap_or_else(|_| panic!("no {want:?}"));
    };

    writeln!(stdin, "hello").unwrap();
    wait_line("echo: hello", &mut printed).await;

    let session = SessionRef { tenant: TEST_TENANT.into(), id: id.clone() };
    let request = WatchRequest { session: Some(session), after_seq: 0, live: false, resume: None };
    let mut events = server.client().watch(request).await.unwrap().into_inner();
    writeln!(stdin, "[[delay:60000]] slow").unwrap();
    let entered = |text: &'static str| move |e: &turnstile_tests::v1::SessionEvent| matches!(&e.payload, Some(Payload::UserMessage(m)) if m.message.as_ref().is_some_and(|m| turnstile_tests::text_of(m) == text));
    wait_event(&mut events, "the slow prompt entered", entered("[[delay:60000]] slow")).await;
    // The agent runs: this line is a steer (a next-step insert).
    writeln!(stdin, "more").unwrap();
    wait_event(&mut events, "the steer", |e| {
        matches!(&e.payload, Some(Payload::InboxSpliced(s))
            if s.target == turnstile_tests::v1::Target::NextStep as i32 && s.inserted.iter().any(|m| turnstile_tests::text_of(m) == "more"))
    })
    .await;
    // Ctrl-C: the running turn ends aborted{user}; the steer stays pending.
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    wait_event(&mut events, "turn 2 aborted", |e| {
        matches!(&e.payload, Some(Payload::TurnEnd(end)) if end.turn == 2 && matches!(end.reason.as_ref().and_then(|r| r.reason.as_ref()), Some(Reason::Aborted(_))))
    })
    .await;
    wait_line("[turn 2 aborted]", &mut printed).await;
    // The next line is a followup; its turn enters the kept steer with it.
    writeln!(stdin, "after").unwrap();
    wait_event(&mut events, "the kept steer entered", entered("more")).await;
    wait_line("after", &mut printed).await;
    drop(stdin);
    let status = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(stderr.contains("[interrupted at seq "), "{stderr}");
    assert!(printed.contains(&"echo: more".to_owned()), "the steer and the followup ran in one step: {printed:?}");
}
