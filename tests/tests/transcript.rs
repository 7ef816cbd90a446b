//! `GetTranscript` (SPEC §21) through the real binary: the conversation as items folded from the log —
//! user messages with their delivery and source, replies, tool calls, the approval decision, results and
//! turn ends with their usage — each carrying the seq of the event it came from; pages of any size join
//! into the whole; another tenant's session is NOT_FOUND like one that does not exist; `turnstile
//! transcript` prints it (one JSON object per item with `--json`). `ListPendingApprovals` lists the calls
//! awaiting a decision, of a session and of the tenant's running sessions page after page; on the cluster both
//! gateways answer the same.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tonic::Code;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::transcript_item::Item;
use turnstile_proto::v1::{
    DeliveryKind, GetTranscriptReply, GetTranscriptRequest, ListPendingApprovalsRequest, SessionRef, TranscriptItem,
};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::msg::TEST_TENANT;
use turnstile_tests::tool_executor::with_token;
use turnstile_tests::{DevOptions, DevServer, Session, user_msg};

/// An agent whose `echo` calls wait for a human.
const CAREFUL: &str = "default_agent = \"careful\"\n\n[agents.careful]\ntools = [\"echo\"]\napproval = [\"echo\"]\n";

async fn page(s: &Session, after_seq: u64, page_size: u32) -> Result<GetTranscriptReply, tonic::Status> {
    let req = GetTranscriptRequest { session: Some(s.reference()), after_seq, page_size };
    s.client().get_transcript(req).await.map(|r| r.into_inner())
}

/// Every item, following `next_seq` with pages of `page_size`.
async fn all_items(s: &Session, page_size: u32) -> Vec<TranscriptItem> {
    let mut items = Vec::new();
    let mut after = 0;
    loop {
        let reply = page(s, after, page_size).await.unwrap();
        assert!(page_size == 0 || reply.items.len() <= page_size as usize, "a page holds at most page_size items");
        items.extend(reply.items);
        if reply.next_seq == 0 {
            return items;
        }
        assert!(reply.next_seq > after, "next_seq advances");
        after = reply.next_seq;
    }
}

/// A short name of an item, to compare a transcript with what the conversation was.
fn brief(item: &TranscriptItem) -> String {
    match item.item.as_ref().expect("an item") {
        Item::User(u) => {
            let m = u.message.as_ref().unwrap();
            format!("user {} {}", DeliveryKind::try_from(u.delivery).unwrap().as_str_name(), m.id)
        }
        Item::Assistant(a) => format!("assistant calls={}", a.tool_calls.len()),
        Item::ToolCall(c) => format!("call {} {} awaiting={}", c.name, c.arguments, c.awaiting_approval),
        Item::ToolDecision(d) => format!("decision approved={} {}", d.approved, d.reason),
        Item::ToolResult(r) => format!("result {} {}", r.name, r.output),
        Item::TurnEnd(_) => format!("turn-end {}", item.turn),
    }
}

#[tokio::test]
async fn the_transcript_shows_the_conversation_with_seqs_and_pages_join_into_it() {
    let (_dir, path) = config_file(CAREFUL);
    let server =
        DevServer::start_with(DevOptions { extra_args: config_args(&path), ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();

    // Turn 1: a call that waits for approval, approved.
    s.followup(user_msg("A", "[[tool:echo hi]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 echo hi awaiting-approval").await.unwrap();
    let (events, _) = s.replay(0).await.unwrap();
    let call = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Payload::ToolCall(c)) => Some(c.call_id.clone()),
            _ => None,
        })
        .unwrap();
    s.decide(&call, true, "fine").await.unwrap();
    s.when_idle().await.unwrap();
    // Turn 2: an inject waits for the followup that opens the turn; the model reports usage.
    s.inject(user_msg("I", "context")).await.unwrap();
    s.followup(user_msg("B", "[[usage:120,7]] plain")).await.unwrap();
    let last_seq = s.when_idle().await.unwrap().last_seq;

    let items = all_items(&s, 0).await;
    let briefs: Vec<String> = items.iter().map(brief).collect();
    let turn1: Vec<&str> = briefs.iter().take(7).map(String::as_str).collect();
    assert_eq!(
        turn1,
        [
            "user DELIVERY_KIND_FOLLOWUP A",
            "assistant calls=1",
            "call echo hi awaiting=true",
            "decision approved=true fine",
            "result echo hi",
            "assistant calls=0",
            "turn-end 1",
        ],
        "{briefs:#?}"
    );
    let mut turn2_users: Vec<&str> = briefs[7..].iter().filter(|b| b.starts_with("user")).map(String::as_str).collect();
    turn2_users.sort_unstable();
    assert_eq!(turn2_users, ["user DELIVERY_KIND_FOLLOWUP B", "user DELIVERY_KIND_INJECT I"], "{briefs:#?}");
    assert_eq!(briefs.last().map(String::as_str), Some("turn-end 2"), "{briefs:#?}");

    // Each item carries the seq (and time, turn) of the event it came from.
    let (events, _) = s.replay(0).await.unwrap();
    let mut previous = 0;
    for item in &items {
        assert!(item.seq > previous && item.seq <= last_seq, "seqs ascend within the log: {briefs:#?}");
        previous = item.seq;
        let event = events.iter().find(|e| e.seq == item.seq).unwrap();
        assert_eq!(event.time_unix_ms, item.time_unix_ms);
        let same = matches!(
            (&item.item, &event.payload),
            (Some(Item::User(_)), Some(Payload::UserMessage(_)))
                | (Some(Item::Assistant(_)), Some(Payload::AssistantMessage(_)))
                | (Some(Item::ToolCall(_)), Some(Payload::ToolCall(_)))
                | (Some(Item::ToolDecision(_)), Some(Payload::ToolDecision(_)))
                | (Some(Item::ToolResult(_)), Some(Payload::ToolResult(_)))
                | (Some(Item::TurnEnd(_)), Some(Payload::TurnEnd(_)))
        );
        assert!(same, "item {} is not the event at its seq: {:?}", brief(item), event.payload);
    }
    // A turn end's usage is the sum of its replies' usage.
    let turn2_usage: u64 = items
        .iter()
        .filter(|i| i.turn == 2)
        .filter_map(|i| match &i.item {
            Some(Item::Assistant(a)) => a.usage.map(|u| u.input_tokens),
            _ => None,
        })
        .sum();
    let Some(Item::TurnEnd(end)) = &items.last().unwrap().item else { panic!("no turn end") };
    assert!(turn2_usage >= 120, "the scripted usage is reported: {turn2_usage}");
    assert_eq!(end.usage.unwrap().input_tokens, turn2_usage);

    // Pages of any size join into the whole; the reply says where Watch goes on.
    for size in [1, 2, 5] {
        assert_eq!(all_items(&s, size).await, items, "pages of {size}");
    }
    let reply = page(&s, 0, 0).await.unwrap();
    assert_eq!((reply.next_seq, reply.last_seq), (0, last_seq));
    let reply = page(&s, 0, 3).await.unwrap();
    assert_eq!(reply.next_seq, reply.items[2].seq);
    let reply = page(&s, last_seq, 0).await.unwrap();
    assert!(reply.items.is_empty() && reply.next_seq == 0);
    let err = page(&s, 0, 1001).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("page_size: 1001 is over the limit of 1000"), "{}", err.message());

    // A session that does not exist is NOT_FOUND.
    let req = GetTranscriptRequest {
        session: Some(SessionRef { tenant: TEST_TENANT.into(), id: "nobody".into() }),
        ..Default::default()
    };
    let err = server.client().get_transcript(req).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // The CLI prints every item, with its seq; `--json` one object per item.
    let id = s.reference().id;
    let base = ["--addr".to_owned(), server.url(), "--tenant".to_owned(), TEST_TENANT.to_owned()];
    let mut args = base.to_vec();
    args.extend(["transcript".to_owned(), id.clone()]);
    let out = turnstile_tests::binary::run_cli(args).await;
    assert!(out.success, "{}", out.stderr);
    // Items start with their seq; a multi-line text goes on below its item.
    let lines: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(lines.len(), items.len(), "{}", out.stdout);
    assert_eq!(lines[0], format!("#{:<4} user (followup): [[tool:echo hi]] go", items[0].seq));
    assert!(lines[3].ends_with(&format!("decision on {call}: approved: fine")), "{}", out.stdout);
    let mut args = base.to_vec();
    args.extend(["--json".to_owned(), "transcript".to_owned(), id]);
    let out = turnstile_tests::binary::run_cli(args).await;
    assert!(out.success, "{}", out.stderr);
    let json: Vec<serde_json::Value> = out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(json.len(), items.len());
    assert_eq!(json[0]["seq"], items[0].seq.to_string());
    assert_eq!(json[0]["user"]["delivery"], "DELIVERY_KIND_FOLLOWUP");
}

const TOKEN_A: &str = "token-of-tenant-a-0123456789";
const TOKEN_B: &str = "token-of-tenant-b-9876543210";

#[tokio::test]
async fn another_tenants_transcript_is_not_found_like_a_missing_session() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let args = vec!["--auth-tokens".to_owned(), tokens.display().to_string()];
    let server = DevServer::start_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    let mut client = server.client();
    let named = |tenant: &str, id: &str| Some(SessionRef { tenant: tenant.into(), id: id.into() });
    let req = turnstile_proto::v1::DeliverRequest {
        session: named("", "b-secret"),
        message: Some(user_msg("m", "hi")),
        output_schema: None,
    };
    client.followup(with_token(req, Some(TOKEN_B))).await.unwrap();
    // The transcript holds what the turn entered: wait for the turn, not for the followup's answer alone
    // (which comes once the message is claimed, before the turn's first step is written; decision 0199).
    let idle = turnstile_proto::v1::WhenIdleRequest { session: named("", "b-secret"), timeout_ms: 0 };
    client.when_idle(with_token(idle, Some(TOKEN_B))).await.unwrap();

    let read = |session, token| {
        let mut client = client.clone();
        async move {
            let req = GetTranscriptRequest { session, ..Default::default() };
            client.get_transcript(with_token(req, Some(token))).await.map(|r| r.into_inner())
        }
    };
    let own = read(named("", "b-secret"), TOKEN_B).await.unwrap();
    assert!(!own.items.is_empty());
    let missing = read(named("tenant-b", "nobody"), TOKEN_B).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let err = read(named("tenant-b", "b-secret"), TOKEN_A).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(err.message(), missing.message().replace("nobody", "b-secret"), "no existence leak");
}

/// Every page of the tenant's pending approvals, following `next_page_token` with pages of one session.
async fn tenant_approvals(server: &DevServer) -> Vec<turnstile_proto::v1::PendingApproval> {
    let mut client = server.client();
    let mut approvals = Vec::new();
    let mut page_token = String::new();
    loop {
        let req =
            ListPendingApprovalsRequest { tenant: TEST_TENANT.into(), page_token, page_size: 1, ..Default::default() };
        let reply = client.list_pending_approvals(req).await.unwrap().into_inner();
        approvals.extend(reply.approvals);
        if reply.next_page_token.is_empty() {
            return approvals;
        }
        page_token = reply.next_page_token;
    }
}

#[tokio::test]
async fn pending_approvals_list_every_waiting_call_of_a_session_and_of_the_tenant() {
    let (_dir, path) = config_file(CAREFUL);
    let server =
        DevServer::start_with(DevOptions { extra_args: config_args(&path), ..DevOptions::default() }).await.unwrap();
    let (one, two, idle) = (server.session(), server.session(), server.session());
    for (s, arg) in [(&one, "one"), (&two, "two")] {
        let watch = s.watch().await.unwrap();
        s.followup(user_msg("A", &format!("[[tool:echo {arg}]] go"))).await.unwrap();
        watch.wait_line(&format!("D tool/call 1.1 echo {arg} awaiting-approval")).await.unwrap();
    }
    idle.followup(user_msg("A", "nothing to approve here")).await.unwrap();
    idle.when_idle().await.unwrap();

    // One session: its waiting call, with the seq and time of its `tool/call`.
    let of = |s: &Session| ListPendingApprovalsRequest { session: Some(s.reference()), ..Default::default() };
    let mut client = server.client();
    let listed = client.list_pending_approvals(of(&one)).await.unwrap().into_inner().approvals;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let approval = &listed[0];
    let (events, _) = one.replay(0).await.unwrap();
    let call = events.iter().find(|e| e.seq == approval.seq).unwrap();
    let Some(Payload::ToolCall(c)) = &call.payload else { panic!("seq {} is not the tool/call", approval.seq) };
    assert_eq!((c.call_id.as_str(), c.awaiting_approval), (approval.call_id.as_str(), true));
    assert_eq!((approval.tool.as_str(), approval.arguments.as_str()), ("echo", "one"));
    assert_eq!((approval.turn, approval.step, approval.since_unix_ms), (1, 1, call.time_unix_ms));
    assert_eq!(approval.session, Some(one.reference()));
    assert_eq!(approval.deadline_unix_ms, None, "no approval_timeout_ms: it waits for a person");
    // GetSession says so too (the status stays RUNNING).
    let info = one.info().await.unwrap();
    assert_eq!(info.status, turnstile_proto::v1::SessionStatus::Running as i32);
    assert_eq!(info.awaiting_approval.as_ref(), Some(approval));

    // The tenant: both waiting calls, page after page (the index may lag the sessions' status: wait for it).
    let deadline = tokio::time::Instant::now() + turnstile_tests::DEFAULT_WAIT;
    let mut tools: Vec<String>;
    loop {
        tools = tenant_approvals(&server).await.into_iter().map(|a| a.arguments).collect();
        tools.sort_unstable();
        if tools == ["one", "two"] || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(tools, ["one", "two"]);

    // Decided, the call leaves the inbox.
    one.decide(&approval.call_id, true, "ok").await.unwrap();
    one.when_idle().await.unwrap();
    let listed = client.list_pending_approvals(of(&one)).await.unwrap().into_inner().approvals;
    assert!(listed.is_empty(), "{listed:?}");
    assert_eq!(one.info().await.unwrap().awaiting_approval, None);
    let err = client
        .list_pending_approvals(ListPendingApprovalsRequest {
            session: Some(SessionRef { tenant: TEST_TENANT.into(), id: "nobody".into() }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

/// SPEC §21: an agent's `approval_timeout_ms` passes and the waiting call is decided by `on_timeout`
/// (deny by default), durably, marked as decided by the timeout; the inbox showed its deadline first.
#[tokio::test]
async fn an_approval_timeout_denies_the_waiting_call_and_the_turn_goes_on() {
    let config = "default_agent = \"hasty\"\n\n[agents.hasty]\ntools = [\"echo\"]\napproval = [\"echo\"]\n\
                  approval_timeout_ms = 1500\n";
    let (_dir, path) = config_file(config);
    let server =
        DevServer::start_with(DevOptions { extra_args: config_args(&path), ..DevOptions::default() }).await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    s.followup(user_msg("A", "[[tool:echo hi]] go")).await.unwrap();
    watch.wait_line("D tool/call 1.1 echo hi awaiting-approval").await.unwrap();
    let req = ListPendingApprovalsRequest { session: Some(s.reference()), ..Default::default() };
    let listed = server.client().list_pending_approvals(req.clone()).await.unwrap().into_inner().approvals;
    // Decided by now only if the machine stalled 1.5 s; then the inbox is empty, and the rest still holds.
    if let Some(a) = listed.first() {
        assert_eq!(a.deadline_unix_ms, Some(a.since_unix_ms + 1500));
    }

    let reason = "no decision within approval_timeout_ms (1500 ms)";
    let lines = watch.settle(&s).await.unwrap();
    assert!(
        lines.iter().any(|l| l.starts_with("D tool/decision 1.1 ") && l.ends_with(&format!("denied {reason:?}"))),
        "{lines:#?}"
    );
    assert!(lines.contains(&format!("D tool/result 1.1 error \"denied: {reason}\"")), "{lines:#?}");
    assert!(lines.contains(&"D turn/end 1 completed".to_owned()), "{lines:#?}");
    let (events, _) = s.replay(0).await.unwrap();
    let decision = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Payload::ToolDecision(d)) => Some(d.clone()),
            _ => None,
        })
        .unwrap();
    assert!(decision.timed_out && !decision.approved, "{decision:?}");
    let listed = server.client().list_pending_approvals(req).await.unwrap().into_inner().approvals;
    assert!(listed.is_empty(), "{listed:?}");
}

/// SPEC §21 with §19: while a call of a client tool of the turn waits for `CompleteToolCall`, GetSession
/// says so (`awaiting_client`, status RUNNING); answered, the field is gone and the turn completes.
#[tokio::test]
async fn get_session_says_when_the_turn_awaits_its_client() {
    use turnstile_proto::v1::content_block::Block;
    use turnstile_proto::v1::{CompleteToolCallRequest, ContentBlock, DataBlock};

    let server = DevServer::start().await.unwrap();
    let s = server.session();
    let watch = s.watch().await.unwrap();
    let mut message = user_msg("A", "[[tool:get_weather {\"city\":\"Paris\"}]] weather?");
    let tools = serde_json::json!([{"name": "get_weather", "parameters": {"type": "object"}}]);
    message.content.push(ContentBlock {
        block: Some(Block::Data(DataBlock {
            mime: turnstile_model::turn_tools::TURN_TOOLS_MIME.into(),
            bytes: serde_json::to_vec(&tools).unwrap(),
        })),
    });
    s.followup(message).await.unwrap();
    watch.wait_line("D tool/call 1.1 get_weather {\"city\":\"Paris\"}").await.unwrap();

    let info = s.info().await.unwrap();
    assert_eq!(info.status, turnstile_proto::v1::SessionStatus::Running as i32);
    assert_eq!(info.awaiting_approval, None);
    let call = info.awaiting_client.expect("GetSession names the call waiting for its client");
    assert!(call.awaiting_client && !call.awaiting_approval, "{call:?}");
    assert_eq!((call.turn, call.step, call.name.as_str()), (1, 1, "get_weather"));
    assert_eq!(call.arguments, "{\"city\":\"Paris\"}");

    let req = CompleteToolCallRequest {
        session: Some(s.reference()),
        call_id: call.call_id.clone(),
        output: "sunny".into(),
        error: None,
    };
    s.client().complete_tool_call(req).await.unwrap();
    s.when_idle().await.unwrap();
    let info = s.info().await.unwrap();
    assert_eq!(info.awaiting_client, None);
    let items: Vec<String> = all_items(&s, 0).await.iter().map(brief).collect();
    assert!(items.contains(&"result get_weather sunny".to_owned()), "{items:#?}");
    assert_eq!(items.last().map(String::as_str), Some("turn-end 1"), "{items:#?}");
}

/// In the `cluster` test group (docs/TESTING.md): two workers, two gateways.
mod cluster {
    use super::*;
    use turnstile_tests::{Cluster, ClusterOptions, DEFAULT_WAIT};

    /// SPEC §21 on the cluster: a call waits for approval in a session owned by some worker; the other
    /// gateway (which routes reads to the owner) lists it in the tenant's approvals inbox and the session's,
    /// both gateways answer the same transcript page after page, and after the decision the inbox is empty
    /// and the transcript shows the decision, the result and the turn's end.
    #[tokio::test]
    async fn both_gateways_answer_the_same_transcript_and_approvals_inbox() {
        let (_dir, path) = config_file(CAREFUL);
        let mut opts = ClusterOptions::new(2, 2);
        opts.worker_args = config_args(&path);
        opts.gateway_args = config_args(&path);
        let cluster = Cluster::start_with(opts).await.unwrap();
        let s0 = cluster.session(0);
        let s1 = cluster.session_via(1, &s0);
        let watch = s1.watch().await.unwrap();
        s0.followup(user_msg("A", "[[tool:echo clustered]] go")).await.unwrap();
        watch.wait_line("D tool/call 1.1 echo clustered awaiting-approval").await.unwrap();

        let mut client = cluster.client(1);
        let of_session = ListPendingApprovalsRequest { session: Some(s0.reference()), ..Default::default() };
        let listed = client.list_pending_approvals(of_session.clone()).await.unwrap().into_inner().approvals;
        assert_eq!(listed.len(), 1, "{listed:?}");
        let call_id = listed[0].call_id.clone();
        assert_eq!((listed[0].tool.as_str(), listed[0].arguments.as_str()), ("echo", "clustered"));
        // The tenant's inbox reads the session index, which follows the session's status: wait for it.
        let tenant = ListPendingApprovalsRequest { tenant: TEST_TENANT.into(), ..Default::default() };
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        loop {
            let all = client.list_pending_approvals(tenant.clone()).await.unwrap().into_inner().approvals;
            if all.iter().any(|a| a.call_id == call_id && a.session == Some(s0.reference())) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the tenant's inbox never listed {call_id}: {all:?}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }

        s1.decide(&call_id, true, "from gateway 1").await.unwrap();
        s0.when_idle().await.unwrap();
        let via0: Vec<String> = all_items(&s0, 2).await.iter().map(brief).collect();
        let via1: Vec<String> = all_items(&s1, 0).await.iter().map(brief).collect();
        assert_eq!(via0, via1, "both gateways, any page size");
        let tail: Vec<&str> = via0.iter().rev().take(4).rev().map(String::as_str).collect();
        assert_eq!(
            tail,
            ["decision approved=true from gateway 1", "result echo clustered", "assistant calls=0", "turn-end 1"],
            "{via0:#?}"
        );
        let listed = client.list_pending_approvals(of_session).await.unwrap().into_inner().approvals;
        assert!(listed.is_empty(), "{listed:?}");
    }
}
