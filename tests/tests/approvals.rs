//! Approvals (SPEC §9) through the real binaries: a call matching the agent's `approval` list is written
//! `tool/call {awaiting_approval}` and waits for `Decide`; approve runs it, deny gives `denied: REASON`,
//! deciding twice or an unknown call is refused, cancel ends a waiting call, `turnstile decide` and
//! `turnstile watch` show and answer it, a waiting call survives the owner's death, and so does its approval
//! deadline (decided once, by the new owner).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::session_event::Payload;
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::msg::TEST_TENANT;
use turnstile_tests::{Cluster, ClusterOptions, DEFAULT_WAIT, DevOptions, DevServer, Session, user_msg};

/// An agent whose `echo` calls wait for a human; `sleep` runs freely.
const CAREFUL: &str =
    "default_agent = \"careful\"\n\n[agents.careful]\ntools = [\"echo\", \"sleep\"]\napproval = [\"echo\"]\n";

/// The call id of the latest `tool/call` awaiting approval, read from the log.
async fn awaiting_call(s: &Session) -> String {
    let (events, _) = s.replay(0).await.unwrap();
    events
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            Some(Payload::ToolCall(c)) if c.awaiting_approval => Some(c.call_id.clone()),
            _ => None,
        })
        .expect("a tool/call awaiting approval")
}

/// Runs the `turnstile` CLI against `url` and returns (success, stdout, stderr).
async fn cli(url: &str, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["--addr".to_owned(), url.to_owned(), "--tenant".to_owned(), TEST_TENANT.to_owned()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let out = turnstile_tests::binary::run_cli(all).await;
    (out.success, out.stdout, out.stderr)
}

#[tokio::test]
async fn approve_with_the_cli_then_deny_and_refuse_bad_decisions() {
    let (_dir, path) = config_file(CAREFUL);
    let server =
        DevServer::start_with(DevOptions { extra_args: config_args(&path), ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();

    s.followup(user_msg("A", "[[tool:echo hi]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 echo hi awaiting-approval").await.unwrap();
    let call = awaiting_call(&s).await;

    // Nothing runs while the call waits; the session stays running.
    let info = s.info().await.unwrap();
    assert_eq!(info.status, turnstile_proto::v1::SessionStatus::Running as i32);
    assert!(!watch.lines().iter().any(|l| l.starts_with("D tool/result")));

    // A decision naming no call is refused as bad input; an unknown call is not found.
    let err = s.decide("", true, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("call_id: is empty"), "{}", err.message());
    let err = s.decide("call-nope", true, "").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("has no tool call call-nope"), "{}", err.message());
    let id = s.reference().id;
    let first = call.clone();

    // `turnstile decide` approves it: the tool runs and the turn completes.
    let (ok, out, err) = cli(&server.url(), &["decide", &id, &call, "--approve", "--reason", "fine"]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with(&format!("approved call_id={call} seq=")), "{out}");
    // Idle, and the watch has everything up to it (WhenIdle can answer before the stream delivers).
    let lines = watch.settle(&s).await.unwrap();
    let at = |pattern: &str| {
        lines
            .iter()
            .position(|l| turnstile_tests::watch::line_matches(l, pattern))
            .unwrap_or_else(|| panic!("no {pattern:?} in:\n{}", lines.join("\n")))
    };
    assert!(
        at("D tool/call 1.1 echo hi awaiting-approval") < at(&format!("D tool/decision 1.1 {call} approved \"fine\""))
    );
    assert!(at(&format!("D tool/decision 1.1 {call} approved *")) < at("D tool/result 1.1 \"hi\""));
    assert!(at("D tool/result 1.1 \"hi\"") < at("D turn/end 1 completed"));

    // Deciding it again is a failed precondition and writes nothing.
    let last = s.info().await.unwrap().last_seq;
    let err = s.decide(&call, false, "too late").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(s.info().await.unwrap().last_seq, last);

    // A denial: the model sees the error result `denied: REASON`.
    s.followup(user_msg("B", "[[tool:echo again]] go")).await.unwrap();
    watch.wait_line("D tool/call 2.1 echo again awaiting-approval").await.unwrap();
    let call = awaiting_call(&s).await;
    s.decide(&call, false, "not on a Friday").await.unwrap();
    let lines = watch.settle(&s).await.unwrap();
    assert!(lines.contains(&format!("D tool/decision 2.1 {call} denied \"not on a Friday\"")), "{lines:#?}");
    assert!(lines.contains(&"D tool/result 2.1 error \"denied: not on a Friday\"".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D turn/end 2 completed".to_owned()), "{lines:#?}");
    // `turnstile watch` shows each waiting call with the command that answers it, and the decisions.
    let (ok, out, err) = cli(&server.url(), &["watch", &id, "--no-live", "--until-idle"]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&format!("tool/call {first} echo hi AWAITING APPROVAL (turnstile decide")), "{out}");
    assert!(out.contains(&format!("tool/decision {first} approved: \"fine\"")), "{out}");
    assert!(out.contains(&format!("tool/call {call} echo again AWAITING APPROVAL")), "{out}");
    assert!(out.contains(&format!("tool/decision {call} denied: \"not on a Friday\"")), "{out}");
}

#[tokio::test]
async fn cancel_ends_a_waiting_call_like_an_unstarted_one() {
    let (_dir, path) = config_file(CAREFUL);
    let server =
        DevServer::start_with(DevOptions { extra_args: config_args(&path), ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:echo hi]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 echo hi awaiting-approval").await.unwrap();
    let call = awaiting_call(&s).await;
    s.cancel(false).await.unwrap();
    let lines = watch.settle(&s).await.unwrap();
    assert!(lines.contains(&"D tool/result 1.1 error \"not run: the turn was aborted\"".to_owned()), "{lines:#?}");
    assert!(lines.contains(&"D turn/end 1 aborted{user}".to_owned()), "{lines:#?}");
    let err = s.decide(&call, true, "").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
}

/// In the `cluster` test group (docs/TESTING.md): it runs three workers and two gateways.
mod cluster {
    use super::*;

    #[tokio::test]
    async fn a_call_waiting_for_approval_survives_its_owner_and_the_approval_runs_it() {
        let (_dir, path) = config_file(CAREFUL);
        let mut opts = ClusterOptions::new(3, 2);
        opts.worker_args = config_args(&path);
        opts.gateway_args = config_args(&path);
        let mut cluster = Cluster::start_with(opts).await.unwrap();
        let s0 = cluster.session(0);
        let s1 = cluster.session_via(1, &s0);
        let watch = s1.watch().await.unwrap();
        s0.followup(user_msg("A", "[[tool:echo survived]] go")).await.unwrap();
        watch.wait_line("D tool/call 1.1 echo survived awaiting-approval").await.unwrap();
        let call = awaiting_call(&s0).await;
        let owner = s0.info().await.unwrap().owner;
        let victim = cluster.worker_index(&owner).unwrap();
        cluster.kill9_worker(victim);

        // The decision reaches the new owner once the shard has moved; until then the gateway says so.
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        loop {
            match s1.decide(&call, true, "after failover").await {
                Ok(_) => break,
                Err(status) if status.code() == Code::Unavailable && tokio::time::Instant::now() < deadline => {}
                Err(status) => panic!("decide after the kill failed: {status:?}\n{}", cluster.logs()),
            }
        }
        let lines = watch.settle(&s1).await.unwrap();
        let durable: Vec<&String> = lines.iter().filter(|l| l.starts_with("D ")).collect();
        assert!(
            !durable.iter().any(|l| l.contains("interrupted")),
            "nothing ran, so nothing is interrupted: {durable:#?}"
        );
        let decision = durable.iter().position(|l| l.starts_with(&format!("D tool/decision 1.1 {call} approved")));
        let result = durable.iter().position(|l| *l == "D tool/result 1.1 \"survived\"");
        assert!(decision.is_some() && decision < result, "the approval ran the tool: {durable:#?}");
        assert!(durable.contains(&&"D turn/end 1 completed".to_owned()), "{durable:#?}");
        let info = s1.info().await.unwrap();
        assert_ne!(info.owner, owner);
        assert!(info.epoch > 1);
    }

    /// SPEC §21: the approval deadline is the logged call's time plus `approval_timeout_ms`, so it crosses
    /// a kill -9 of the owner: the new owner's driver decides the call by `on_timeout` once — one
    /// `tool/decision {timed_out}`, one result, one turn end — whoever held the session when it passed.
    #[tokio::test]
    async fn an_approval_deadline_crosses_a_kill_of_its_owner_and_is_decided_once() {
        let config = "default_agent = \"hasty\"\n\n[agents.hasty]\ntools = [\"echo\"]\napproval = [\"echo\"]\n\
                      approval_timeout_ms = 5000\n";
        let (_dir, path) = config_file(config);
        let mut opts = ClusterOptions::new(3, 2);
        opts.worker_args = config_args(&path);
        opts.gateway_args = config_args(&path);
        let mut cluster = Cluster::start_with(opts).await.unwrap();
        let s0 = cluster.session(0);
        let s1 = cluster.session_via(1, &s0);
        let watch = s1.watch().await.unwrap();
        s0.followup(user_msg("A", "[[tool:echo late]] go")).await.unwrap();
        watch.wait_line("D tool/call 1.1 echo late awaiting-approval").await.unwrap();
        let call = awaiting_call(&s0).await;
        let (before, _) = s0.replay(0).await.unwrap();
        let decided_before_kill = before.iter().any(|e| matches!(e.payload, Some(Payload::ToolDecision(_))));
        let owner = s0.info().await.unwrap().owner;
        let victim = cluster.worker_index(&owner).unwrap();
        cluster.kill9_worker(victim);

        let lines = watch.settle(&s1).await.unwrap();
        let reason = "no decision within approval_timeout_ms (5000 ms)";
        let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("D tool/decision "), 1, "decided once: {lines:#?}\n{}", cluster.logs());
        assert_eq!(count("D tool/result "), 1, "{lines:#?}");
        assert_eq!(count("D turn/end "), 1, "{lines:#?}");
        assert!(lines.contains(&format!("D tool/result 1.1 error \"denied: {reason}\"")), "{lines:#?}");
        assert!(lines.contains(&"D turn/end 1 completed".to_owned()), "{lines:#?}");

        let (events, _) = s1.replay(0).await.unwrap();
        let decisions: Vec<_> = events
            .iter()
            .filter_map(|e| match &e.payload {
                Some(Payload::ToolDecision(d)) => Some((e.time_unix_ms, d.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        let (decided_at, decision) = &decisions[0];
        assert_eq!(decision.call_id, call);
        assert!(decision.timed_out && !decision.approved, "{decision:?}");
        let called_at = events
            .iter()
            .find(|e| matches!(&e.payload, Some(Payload::ToolCall(c)) if c.call_id == call))
            .map(|e| e.time_unix_ms)
            .unwrap();
        assert!(*decided_at >= called_at + 5000, "not before the deadline: call {called_at}, decision {decided_at}");
        let info = s1.info().await.unwrap();
        assert_ne!(info.owner, owner, "the new owner decided it");
        assert!(
            !decided_before_kill,
            "the old owner had decided before the kill (a 5 s stall): the test proved nothing"
        );
        assert_eq!(info.awaiting_approval, None);
    }
}
