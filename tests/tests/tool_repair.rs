//! Tool idempotency across a repair (SPEC §20, issue 42, decision 0143), on a real cluster: the owner of a
//! session is killed -9 while an MCP tool call runs. The tool is `tests/fixtures/key_recorder_mcp.py`
//! (PyPI `mcp`, stdio, one per worker): it appends the idempotency key of each call it gets to a file and
//! holds the call until the test creates its GO file.
//!
//! - With `retry_after_repair` for the tool, the new owner calls it again in the same turn and step: the
//!   server sees the same key twice, and the turn ends once, `completed`, with the second call's result.
//! - Without it, the call is ended interrupted and never run again: the server saw the key once, and the
//!   session is idle with the turn ended `interrupted` and the next one answering the interrupted result.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{RepairAction, SessionEvent};
use turnstile_tests::config::config_args;
use turnstile_tests::{Cluster, ClusterOptions, DEFAULT_WAIT, Session, user_msg};

/// The prompt: one call of the recorder's tool, by the name the model sees (`SERVER__TOOL`).
const PROMPT: &str = r#"[[tool:pay__charge {"amount": 5}]] pay"#;

/// How often the test looks at the recorder's key file while it waits for a line.
const POLL: Duration = Duration::from_millis(20);

/// The recorder's files and the configuration that runs it.
struct Recorder {
    dir: TempDir,
}

impl Recorder {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }

    fn keys_path(&self) -> PathBuf {
        self.dir.path().join("keys")
    }

    fn go_path(&self) -> PathBuf {
        self.dir.path().join("go")
    }

    /// The configuration: the recorder as MCP server `pay`, and the default agent calling its `charge`,
    /// retried after a repair when `retry`.
    fn config(&self, retry: bool) -> PathBuf {
        let python = std::env::var("TURNSTILE_TEST_PYTHON").unwrap_or_else(|_| {
            panic!("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`")
        });
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/key_recorder_mcp.py");
        let retry = if retry { "retry_after_repair = [\"mcp:pay/charge\"]\n" } else { "" };
        let text = format!(
            "default_agent = \"payer\"\n\n[mcp.pay]\ncommand = {python:?}\nargs = [{:?}, {:?}, {:?}]\n\n\
             [agents.payer]\ntools = [\"mcp:pay/charge\"]\n{retry}",
            script.display().to_string(),
            self.keys_path().display().to_string(),
            self.go_path().display().to_string(),
        );
        let path = self.dir.path().join("turnstile.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The keys the recorder's servers have seen so far, in order.
    fn keys(&self) -> Vec<String> {
        match std::fs::read_to_string(self.keys_path()) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("reading the recorder's keys: {e}"),
        }
    }

    /// Waits until the servers have seen `n` calls, and returns their keys.
    async fn wait_keys(&self, n: usize) -> Vec<String> {
        tokio::time::timeout(DEFAULT_WAIT, async {
            loop {
                let keys = self.keys();
                if keys.len() >= n {
                    return keys;
                }
                tokio::time::sleep(POLL).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the MCP server saw {:?}, waiting for {n} calls", self.keys()))
    }

    /// Lets every held call return.
    fn go(&self) {
        std::fs::write(self.go_path(), b"go").unwrap();
    }
}

/// A cluster of two workers and one gateway running `config`.
async fn cluster(config: &Path) -> Cluster {
    let mut opts = ClusterOptions::new(2, 1);
    opts.worker_args = config_args(config);
    opts.gateway_args = config_args(config);
    Cluster::start_with(opts).await.unwrap()
}

/// Starts the call, waits until the MCP server holds it, and kills the session's owner -9. Returns the
/// key the server saw.
async fn kill_the_owner_mid_call(cluster: &mut Cluster, s: &Session, recorder: &Recorder) -> String {
    s.followup(user_msg("A", PROMPT)).await.unwrap();
    let first = recorder.wait_keys(1).await;
    let owner = s.info().await.unwrap().owner;
    let victim = cluster.worker_index(&owner).unwrap_or_else(|| panic!("{owner:?} is not a worker"));
    cluster.kill9_worker(victim);
    first[0].clone()
}

/// The key SPEC §20 gives call `call_id` of step 1 of turn 1.
fn expected_key(s: &Session, call_id: &str) -> String {
    let r = s.reference();
    format!("{}/{}/1/1/{call_id}", r.tenant, r.id)
}

fn tool_calls(events: &[SessionEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::ToolCall(c)) => Some((c.call_id.clone(), c.idempotency_key.clone())),
            _ => None,
        })
        .collect()
}

fn repairs(events: &[SessionEvent]) -> Vec<(String, RepairAction)> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::ToolRepaired(r)) => Some((r.call_id.clone(), r.action())),
            _ => None,
        })
        .collect()
}

/// In the `cluster` test group (docs/TESTING.md): each test runs two workers and a gateway.
mod cluster {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_retry_after_repair_the_tool_sees_the_same_key_twice_and_the_turn_completes_once() {
        let recorder = Recorder::new();
        let mut cluster = cluster(&recorder.config(true)).await;
        let s = cluster.session(0);
        let watch = s.watch().await.unwrap();
        let first = kill_the_owner_mid_call(&mut cluster, &s, &recorder).await;
        assert_eq!(first, expected_key(&s, "call-1-1-1"));

        // The new owner takes the session over (it was running) and calls the tool again.
        let keys = recorder.wait_keys(2).await;
        assert_eq!(keys, [first.clone(), first.clone()], "the same call, under the same key");
        recorder.go();
        let lines = watch.settle(&s).await.unwrap();

        let (events, _) = s.replay(0).await.unwrap();
        assert_eq!(tool_calls(&events), [("call-1-1-1".to_owned(), first.clone())], "one call, run twice");
        assert_eq!(repairs(&events), [("call-1-1-1".to_owned(), RepairAction::Retried)]);
        let ends: Vec<&String> = lines.iter().filter(|l| l.starts_with("D turn/end")).collect();
        assert_eq!(ends, ["D turn/end 1 completed"], "the turn ends once: {lines:#?}");
        let result = format!("D tool/result 1.1 {:?}", format!("charged 5 under {first}"));
        assert!(lines.contains(&result), "the retried call's result: {lines:#?}");
        assert_eq!(recorder.keys().len(), 2, "no third call");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_retry_after_repair_the_call_is_interrupted_and_never_run_again() {
        let recorder = Recorder::new();
        let mut cluster = cluster(&recorder.config(false)).await;
        let s = cluster.session(0);
        let watch = s.watch().await.unwrap();
        let first = kill_the_owner_mid_call(&mut cluster, &s, &recorder).await;
        assert_eq!(first, expected_key(&s, "call-1-1-1"));

        // The new owner repairs and resumes the session; once it is idle with nothing pending, nothing
        // more can run.
        watch.wait_line("D turn/end 1 interrupted").await.unwrap();
        let lines = watch.settle(&s).await.unwrap();
        // Let the killed worker's server, still holding the first call, end.
        recorder.go();

        let (events, _) = s.replay(0).await.unwrap();
        assert_eq!(tool_calls(&events), [("call-1-1-1".to_owned(), first.clone())], "never called again");
        assert_eq!(repairs(&events), [("call-1-1-1".to_owned(), RepairAction::Interrupted)]);
        assert_eq!(recorder.keys(), [first], "the MCP server saw the call once");
        let interrupted = lines.iter().position(|l| l.starts_with("D tool/result 1.1 error \"interrupted:"));
        assert!(interrupted.is_some(), "the call's result is the repair's: {lines:#?}");
        let ends: Vec<&String> = lines.iter().filter(|l| l.starts_with("D turn/end")).collect();
        assert_eq!(ends, ["D turn/end 1 interrupted", "D turn/end 2 completed"], "{lines:#?}");
        let answer = "D assistant/message 2.1 \"tool results: pay__charge failed: interrupted: the worker running \
                      this call stopped before it finished\"";
        assert!(
            lines.iter().any(|l| l == answer),
            "the resumed turn answers the interrupted result, not the prompt again: {lines:#?}"
        );
    }
}
