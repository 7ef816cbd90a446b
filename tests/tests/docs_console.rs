//! The command blocks of the documentation that show real output run here and must match (issue 31).
//!
//! A ```` ```console ```` block is a claim: every `$ COMMAND` line in it runs (with `bash`, from the top of
//! the checkout, `turnstile` on `PATH` and `TURNSTILE_ADDR` naming a `turnstile dev` the test started on
//! port 0) and prints the lines below it. Blocks that only show commands are ```` ```sh ````. Each document
//! with console blocks names the server its blocks run against in a comment, `<!-- doc-test: dev ARGS -->`
//! (one server per document, blocks in order, state carried from block to block); between blocks,
//! `<!-- doc-test: wait SESSION TYPE -->` waits until the session's log (or live tail) has an event of that
//! type, where a reader would wait for it too (a tool call to be running, say).
//!
//! Output is compared after replacing what differs from run to run: UUIDs and the 8-digit hex ids the CLI
//! abbreviates them to, the measured `after N of M ms` of an aborted sleep, and the text an interrupted
//! stream had delivered. `TURNSTILE_BLESS=1` writes the actual output into the document instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt as _;
use turnstile_proto::v1 as pb;
use turnstile_tests::binary::turnstile_bin;
use turnstile_tests::{DevOptions, DevServer};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// One step of a document: a console block or a wait between blocks.
#[derive(Debug)]
enum Step {
    /// `(command, expected output lines)` in order; `range` is the block's body in the document.
    Block {
        commands: Vec<(String, Vec<String>)>,
        range: std::ops::Range<usize>,
    },
    Wait {
        session: String,
        event_type: String,
    },
}

struct Document {
    server_args: Vec<String>,
    steps: Vec<Step>,
}

fn parse(text: &str) -> Option<Document> {
    let mut server_args = None;
    let mut steps = Vec::new();
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        let start = offset;
        offset += line.len();
        if let Some(directive) = line.trim().strip_prefix("<!-- doc-test:").and_then(|d| d.strip_suffix("-->")) {
            let words: Vec<String> = directive.split_whitespace().map(str::to_owned).collect();
            match words.first().map(String::as_str) {
                Some("dev") => server_args = Some(words[1..].to_vec()),
                Some("wait") => steps.push(Step::Wait { session: words[1].clone(), event_type: words[2].clone() }),
                other => panic!("unknown doc-test directive {other:?} at byte {start}"),
            }
            continue;
        }
        if line.trim_end() != "```console" {
            continue;
        }
        let body_start = offset;
        let mut commands: Vec<(String, Vec<String>)> = Vec::new();
        for body in lines.by_ref() {
            if body.trim_end() == "```" {
                break;
            }
            offset += body.len();
            let body = body.trim_end_matches('\n');
            match body.strip_prefix("$ ") {
                Some(command) => commands.push((command.to_owned(), Vec::new())),
                None => commands.last_mut().expect("a console block starts with `$ `").1.push(body.to_owned()),
            }
        }
        let body_end = offset;
        offset += "```\n".len();
        steps.push(Step::Block { commands, range: body_start..body_end });
    }
    let blocks = steps.iter().filter(|s| matches!(s, Step::Block { .. })).count();
    if blocks == 0 {
        return None;
    }
    let server_args = server_args.expect("a document with console blocks names its server: <!-- doc-test: dev … -->");
    Some(Document { server_args, steps })
}

/// Replaces, in one line, what changes from run to run.
fn normalize(line: &str) -> String {
    let mut out = String::new();
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        let hex = |s: &str| s.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
        let parts: Vec<&str> = token.split('-').collect();
        let uuid = parts.len() == 5 && [8, 4, 4, 4, 12].iter().zip(&parts).all(|(n, p)| p.len() == *n && hex(p));
        if uuid {
            out.push_str("<uuid>");
        } else if token.len() == 8 && hex(token) {
            out.push_str("<id8>");
        } else if token.starts_with("goal-") && token.len() == 8 && hex(&token[5..]) {
            out.push_str("goal-<id>");
        } else {
            out.push_str(token);
        }
        token.clear();
    };
    for c in line.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    // `aborted after 834 of 5000 ms`: how far a sleep got.
    if let Some(at) = out.find("aborted after ") {
        let rest = &out[at + "aborted after ".len()..];
        if let Some(of) = rest.find(" of ") {
            out = format!("{}aborted after N{}", &out[..at], &rest[of..]);
        }
    }
    // The text an interrupted stream had delivered.
    if out.contains("assistant/message \"") && out.trim_end().ends_with(" interrupted") {
        let open = out.find('"').unwrap();
        let close = out.rfind('"').unwrap();
        out = format!("{}\"…\"{}", &out[..open], &out[close + 1..]);
    }
    out
}

async fn run_command(command: &str, bin_dir: &Path, addr: &str) -> Vec<String> {
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!("{command} 2>&1"))
        .current_dir(root())
        .env("PATH", path)
        .env("TURNSTILE_ADDR", addr)
        .env("NO_COLOR", "1")
        .env_remove("TURNSTILE_TOKEN")
        .stdin(std::process::Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await.expect("a command of the doc ran over 60 s");
    String::from_utf8_lossy(&out.unwrap().stdout).lines().map(str::to_owned).collect()
}

/// Waits until `session`'s Watch (durable or live) has an event of `event_type`.
async fn wait_for(server: &DevServer, session: &str, event_type: &str) {
    let mut client = server.client();
    let request = pb::WatchRequest {
        session: Some(pb::SessionRef { tenant: String::new(), id: session.to_owned() }),
        after_seq: 0,
        live: true,
        resume: None,
    };
    let mut stream = client.watch(request).await.unwrap().into_inner();
    let found = async {
        while let Some(item) = stream.next().await {
            let found = match item.unwrap().item {
                Some(pb::watch_item::Item::Event(e)) => e.r#type == event_type,
                Some(pb::watch_item::Item::Live(l)) => l.r#type == event_type,
                _ => false,
            };
            if found {
                return;
            }
        }
        panic!("the watch of {session} ended before a {event_type}");
    };
    tokio::time::timeout(Duration::from_secs(30), found)
        .await
        .unwrap_or_else(|_| panic!("no {event_type} in session {session} within 30 s"));
}

async fn check_document(relative: &str) {
    let path = root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap();
    let Some(document) = parse(&text) else { panic!("{relative} has no console block") };
    let bin = tokio::task::spawn_blocking(turnstile_bin).await.unwrap().unwrap();
    let bin_dir = bin.parent().unwrap().to_path_buf();
    // Paths in the server's arguments are relative to the top of the checkout, as the reader runs them.
    let args = document
        .server_args
        .iter()
        .map(|a| if root().join(a).is_file() { root().join(a).display().to_string() } else { a.clone() })
        .collect();
    let options = DevOptions { extra_args: args, ..DevOptions::default() };
    let server = DevServer::start_with(options).await.unwrap();
    let addr = server.url();
    let bless = std::env::var_os("TURNSTILE_BLESS").is_some();
    let mut rewritten = Vec::new();
    let mut mismatches = Vec::new();
    for step in &document.steps {
        match step {
            Step::Wait { session, event_type } => wait_for(&server, session, event_type).await,
            Step::Block { commands, range } => {
                let mut body = String::new();
                for (command, expected) in commands {
                    let actual = run_command(command, &bin_dir, &addr).await;
                    body.push_str(&format!("$ {command}\n"));
                    for line in &actual {
                        body.push_str(line);
                        body.push('\n');
                    }
                    let want: Vec<String> = expected.iter().map(|l| normalize(l)).collect();
                    let got: Vec<String> = actual.iter().map(|l| normalize(l)).collect();
                    if want != got {
                        mismatches.push(format!(
                            "$ {command}\n--- the document says:\n{}\n--- the run printed:\n{}",
                            expected.join("\n"),
                            actual.join("\n")
                        ));
                    }
                }
                rewritten.push((range.clone(), body));
            }
        }
    }
    server.stop().await;
    if bless {
        let mut text = text;
        for (range, body) in rewritten.into_iter().rev() {
            text.replace_range(range, &body);
        }
        std::fs::write(&path, text).unwrap();
        return;
    }
    assert!(
        mismatches.is_empty(),
        "{relative}: {} command(s) print something else than the document shows (TURNSTILE_BLESS=1 rewrites \
         the document from a run):\n\n{}",
        mismatches.len(),
        mismatches.join("\n\n")
    );
}

#[tokio::test]
async fn the_tour_prints_what_it_shows() {
    check_document("docs/TOUR.md").await;
}

#[test]
fn every_console_block_is_in_a_document_this_test_runs() {
    // A console block claims real output; one in a document without a test here would claim it unchecked.
    let checked = ["docs/TOUR.md"];
    let mut unchecked = Vec::new();
    let mut documents = vec![root().join("README.md")];
    for dir in ["docs", "clients/python"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                documents.push(path);
            }
        }
    }
    for path in documents {
        let relative = path.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        if text.lines().any(|l| l.trim_end() == "```console") && !checked.contains(&relative.as_str()) {
            unchecked.push(relative);
        }
    }
    assert!(unchecked.is_empty(), "console blocks no test runs (make them ```sh, or run them here): {unchecked:?}");
}

#[test]
fn normalizing_keeps_what_is_stable() {
    assert_eq!(
        normalize("accepted id=8074ef14-e870-4248-9e15-30286aaf0dd2 seq=1 turn=1"),
        "accepted id=<uuid> seq=1 turn=1"
    );
    assert_eq!(normalize("#2   spliced next-turn @0 -0 +[goal-937 \"x\" <goal:93713e7c:1:1>] wake"), {
        "#2   spliced next-turn @0 -0 +[goal-<id> \"x\" <goal:<id8>:1:1>] wake"
    });
    assert_eq!(
        normalize("#29      tool/result call-2-1-1 error \"aborted after 834 of 5000 ms\""),
        "#29      tool/result call-2-1-1 error \"aborted after N of 5000 ms\""
    );
    assert_eq!(normalize("#9       assistant/message \"echo: tell \" interrupted"), {
        "#9       assistant/message \"…\" interrupted"
    });
    assert_eq!(
        normalize("#7       assistant/message \"echo: deploy v2\""),
        "#7       assistant/message \"echo: deploy v2\""
    );
}
