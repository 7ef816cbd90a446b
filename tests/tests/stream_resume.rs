//! Streams that resume (SPEC §14): every delta carries its byte offset in the step's output; a `Watch` that
//! joins while a step streams gets the output so far right after `caught_up`, from its `resume` offsets,
//! then the live rest, with nothing missing and nothing twice; watchers connected before a step get every
//! delta of it. On `dev` (both journals) and on the cluster, through either gateway.
//!
//! Every stream here is checked by [`check_stream`] (called by `settle`), which includes the offsets: each
//! delta of a step starts where the previous one ended.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use turnstile_proto::v1::watch_item::Item;
use turnstile_proto::v1::{StreamResume, WatchRequest};
use turnstile_tests::watch::{check_stream, position, step_output};
use turnstile_tests::{Backend, Session, WatchRecorder, user_msg};

/// A reply of many words (multi-byte characters included, so offsets are bytes, not characters), streamed
/// by the scripted model in ten deltas over the delay.
fn slow(delay_ms: u64, n: usize) -> String {
    format!("[[delay:{delay_ms}]] héllo wörld {n}, this reply streams slowly in ten pieces 🎉 so a watcher can join it")
}

/// The reply's durable text as `watcher` recorded it.
fn reply(watcher: &WatchRecorder) -> String {
    watcher.assistant_message(1, 1).expect("the step's assistant/message").text
}

async fn a_watcher_joining_mid_step_gets_the_output_so_far_then_the_rest(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let first = s.watch().await.unwrap();
    s.followup(user_msg("A", &slow(2000, 1))).await.unwrap();
    first.wait_count("L delta 1.1 *", 2).await.unwrap();

    // A new watcher (a page reload): caught_up, then at once the output so far from offset 0.
    let second = s.watch().await.unwrap();
    second.wait_line("L delta 1.1 *").await.unwrap();
    let items = second.items();
    let after_caught_up = items.iter().skip_while(|i| !matches!(i.item, Some(Item::CaughtUp(_)))).nth(1);
    let Some(Item::Live(live)) = after_caught_up.and_then(|i| i.item.clone()) else {
        panic!("the output so far must follow caught_up, got {after_caught_up:?}")
    };
    let Some(turnstile_proto::v1::live_event::Payload::AssistantDelta(partial)) = live.payload else {
        panic!("expected a delta right after caught_up: {live:?}")
    };
    assert_eq!(partial.offset, 0);
    assert!(partial.text.starts_with("echo: "), "{partial:?}");

    second.settle(&s).await.unwrap();
    first.settle(&s).await.unwrap();
    let text = reply(&second);
    assert_eq!(second.step_output(1, 1, false), Some((0, text.clone())), "the joined watcher has every byte once");
    assert_eq!(first.step_output(1, 1, false), Some((0, text)), "the first watcher too");
}

async fn a_resumed_watch_gets_only_what_its_client_lacks(backend: Backend) {
    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let first = s.watch().await.unwrap();
    s.followup(user_msg("A", &slow(2000, 2))).await.unwrap();
    first.wait_count("L delta 1.1 *", 3).await.unwrap();
    let seen = first.disconnect().await;
    check_stream(&seen, 0).unwrap();
    let (start, got) = step_output(&seen, 1, 1, false).unwrap();
    assert_eq!(start, 0);

    let request = WatchRequest {
        session: Some(s.reference()),
        after_seq: position(&seen),
        live: true,
        resume: Some(StreamResume { turn: 1, step: 1, text_offset: got.len() as u64, reasoning_offset: 0 }),
    };
    let second = WatchRecorder::start_request(s.client(), request).await.unwrap();
    second.settle(&s).await.unwrap();
    let (offset, rest) = second.step_output(1, 1, false).expect("the rest of the reply");
    assert_eq!(offset, got.len() as u64, "the resumed stream starts exactly where the client was");
    let (log, _) = s.replay(0).await.unwrap();
    let text = log
        .iter()
        .find_map(|e| match &e.payload {
            Some(turnstile_proto::v1::session_event::Payload::AssistantMessage(m)) => Some(m.text.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(got + &rest, text, "both streams together are the reply, each byte once");
}

/// `turnstile watch` whose connection is cut mid-reply reopens its stream with its seq and offsets: its
/// output shows the reply once, on one delta line, exactly as an unbroken watch would, and stderr says it
/// reconnected.
async fn the_cli_watch_reopens_a_lost_stream_and_goes_on_mid_reply(backend: Backend) {
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncReadExt;

    let server = backend.start_dev().await.unwrap();
    let s = server.session();
    let proxy = turnstile_tests::proxy::CutProxy::start(server.addr()).await.unwrap();
    let bin = tokio::task::spawn_blocking(turnstile_tests::binary::turnstile_bin).await.unwrap().unwrap();
    let mut cli = tokio::process::Command::new(bin)
        .args(["watch", &s.reference().id, "--addr", &proxy.url(), "--tenant", &s.reference().tenant])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = Arc::new(Mutex::new(String::new()));
    let mut pipe = cli.stdout.take().unwrap();
    let sink = Arc::clone(&stdout);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf).await
            && n > 0
        {
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let shown = || stdout.lock().unwrap().clone();
    let wait_for = |what: &'static str| async move {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while !shown().contains(what) {
            assert!(tokio::time::Instant::now() < deadline, "no {what:?} in the watch output:\n{}", shown());
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    // The watch's history of a new session is empty: it is caught up at once.
    wait_for("== caught up at #0").await;
    s.followup(user_msg("A", &slow(3000, 3))).await.unwrap();
    wait_for("~").await;
    wait_for("héllo").await;
    assert!(proxy.cut() >= 1, "the watch's connection was open");

    wait_for("turn/end 1").await;
    cli.start_kill().unwrap();
    cli.wait().await.unwrap();
    reader.await.unwrap();
    let mut stderr = String::new();
    cli.stderr.take().unwrap().read_to_string(&mut stderr).await.unwrap();
    assert!(stderr.contains("reopening after #"), "stderr: {stderr}");
    let out = shown();
    let text = s.replay(0).await.unwrap().0.into_iter().find_map(|e| match e.payload {
        Some(turnstile_proto::v1::session_event::Payload::AssistantMessage(m)) => Some(m.text),
        _ => None,
    });
    let text = text.expect("the reply");
    let delta_lines: Vec<&str> = out.lines().filter(|l| l.starts_with('~') && l.contains("echo: ")).collect();
    assert_eq!(delta_lines.len(), 1, "one delta line:\n{out}");
    assert!(
        delta_lines[0].trim_start_matches('~').trim_start() == text,
        "{:?} is not the reply {text:?}",
        delta_lines[0]
    );
    assert_eq!(out.matches("== caught up").count(), 1, "a reopened stream's marker is not shown:\n{out}");
}

turnstile_tests::backend_tests!(
    a_watcher_joining_mid_step_gets_the_output_so_far_then_the_rest,
    a_resumed_watch_gets_only_what_its_client_lacks,
    the_cli_watch_reopens_a_lost_stream_and_goes_on_mid_reply
);

/// The cluster (3 workers, 2 gateways): the `cluster::` prefix puts these in the test group that runs one
/// whole cluster at a time.
mod cluster {
    use std::time::Duration;

    use super::*;
    use turnstile_tests::Cluster;

    /// Rounds of each test, run in this many lanes at once (each lane its own sessions).
    const ROUNDS: usize = 200;
    const LANES: usize = 10;

    /// How a resume round went.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Resumed {
        /// The second stream continued the step's deltas where the client was, to the end of the reply.
        MidStep,
        /// The step had ended before the second stream joined: its `assistant/message` (after the
        /// client's seq) holds the rest, and no delta repeats or skips anything.
        AfterStep,
        /// The client had the whole reply already.
        Whole,
    }

    /// One round: a watcher through gateway `g` is dropped at a point that varies by round (before the
    /// first delta, mid-reply, or after the reply) and reconnects through the other gateway with its seq
    /// and offsets.
    async fn resume_round(cluster: &Cluster, round: usize) -> Result<Resumed, String> {
        let g = round % 2;
        let s = cluster.session(g);
        let other = cluster.session_via(1 - g, &s);
        let first = s.watch().await.map_err(|e| e.to_string())?;
        s.followup(user_msg(&format!("m{round}"), &slow(400, round))).await.map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis((round as u64 * 53) % 520)).await;
        let seen = first.disconnect().await;
        check_stream(&seen, 0).map_err(|e| format!("first stream: {e}"))?;
        let (start, got) = step_output(&seen, 1, 1, false).unwrap_or((0, String::new()));
        if start != 0 {
            return Err(format!("the first watcher, there before the step, started at offset {start}"));
        }
        let request = WatchRequest {
            session: Some(other.reference()),
            after_seq: position(&seen),
            live: true,
            resume: Some(StreamResume { turn: 1, step: 1, text_offset: got.len() as u64, reasoning_offset: 0 }),
        };
        let second = WatchRecorder::start_request(other.client(), request).await.map_err(|e| e.to_string())?;
        second.settle(&other).await.map_err(|e| format!("second stream: {e}"))?;
        let rest = match second.step_output(1, 1, false) {
            Some((offset, rest)) if offset == got.len() as u64 => rest,
            Some((offset, rest)) => {
                return Err(format!(
                    "resumed at offset {offset} ({rest:?}) where the client had {}: {got:?}",
                    got.len()
                ));
            }
            None => String::new(),
        };
        let (text, in_second) = match (reply_in(&seen), second.assistant_message(1, 1)) {
            (Some(text), _) => (text, false),
            (None, Some(m)) => (m.text, true),
            (None, None) => return Err("neither stream has the assistant/message".into()),
        };
        let deltas = got.clone() + &rest;
        if deltas == text {
            Ok(if rest.is_empty() { Resumed::Whole } else { Resumed::MidStep })
        } else if in_second && text.starts_with(&deltas) && rest.is_empty() {
            Ok(Resumed::AfterStep)
        } else {
            Err(format!(
                "deltas {got:?} + {rest:?} are not the reply {text:?} (message in the second stream: {in_second})"
            ))
        }
    }

    fn reply_in(items: &[turnstile_proto::v1::WatchItem]) -> Option<String> {
        items.iter().find_map(|i| match &i.item {
            Some(Item::Event(e)) => match &e.payload {
                Some(turnstile_proto::v1::session_event::Payload::AssistantMessage(m)) => Some(m.text.clone()),
                _ => None,
            },
            _ => None,
        })
    }

    /// One round: watchers on both gateways, connected before the followup, each get every delta.
    async fn before_round(cluster: &Cluster, round: usize) -> Result<(), String> {
        let s = cluster.session(round % 2);
        let watchers: Vec<(Session, WatchRecorder)> = {
            let mut all = Vec::new();
            for g in 0..2 {
                let via = cluster.session_via(g, &s);
                let w = via.watch().await.map_err(|e| e.to_string())?;
                all.push((via, w));
            }
            all
        };
        s.followup(user_msg(&format!("m{round}"), &slow((round as u64 % 4) * 100, round)))
            .await
            .map_err(|e| e.to_string())?;
        for (g, (via, w)) in watchers.iter().enumerate() {
            w.settle(via).await.map_err(|e| format!("gateway {g}: {e}"))?;
            let text = reply(w);
            if w.step_output(1, 1, false) != Some((0, text.clone())) {
                return Err(format!("gateway {g}: deltas {:?} but the reply is {text:?}", w.step_output(1, 1, false)));
            }
        }
        Ok(())
    }

    /// Runs `ROUNDS` rounds of `round` in `LANES` lanes; fails with every round that went wrong, else
    /// returns each round's outcome.
    async fn rounds<T, F, Fut>(cluster: &Cluster, round: F) -> Vec<T>
    where
        F: Fn(usize) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let lanes = (0..LANES).map(|lane| {
            let round = &round;
            async move {
                let mut outcomes = Vec::new();
                for r in (lane..ROUNDS).step_by(LANES) {
                    outcomes.push(round(r).await.map_err(|e| format!("round {r}: {e}")));
                }
                outcomes
            }
        });
        let (done, failed): (Vec<_>, Vec<_>) =
            futures::future::join_all(lanes).await.into_iter().flatten().partition(Result::is_ok);
        let failed: Vec<String> = failed.into_iter().filter_map(Result::err).collect();
        assert!(
            failed.is_empty(),
            "{} of {ROUNDS} rounds failed:\n{}\n{}",
            failed.len(),
            failed.join("\n"),
            cluster.logs()
        );
        done.into_iter().filter_map(Result::ok).collect()
    }

    #[tokio::test]
    async fn a_watcher_dropped_anywhere_resumes_through_the_other_gateway() {
        let cluster = Cluster::start(3, 2).await.unwrap();
        cluster.wait_balanced().await.unwrap();
        let outcomes = rounds(&cluster, |r| resume_round(&cluster, r)).await;
        let mid_step = outcomes.iter().filter(|o| **o == Resumed::MidStep).count();
        // The drop points spread over the whole reply, so most rounds resume mid-step; a tenth is far below
        // what any run showed, and would only fail if the mid-step path stopped being exercised.
        assert!(mid_step >= ROUNDS / 10, "only {mid_step} of {ROUNDS} rounds resumed mid-step: {outcomes:?}");
    }

    #[tokio::test]
    async fn watchers_connected_before_a_step_get_every_delta() {
        let cluster = Cluster::start(3, 2).await.unwrap();
        cluster.wait_balanced().await.unwrap();
        rounds(&cluster, |r| before_round(&cluster, r)).await;
    }
}
