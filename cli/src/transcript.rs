//! `turnstile transcript SESSION`: the conversation as `GetTranscript` items (SPEC §21), every page, one
//! line per item (`--json`: each item in the protobuf JSON mapping), oldest first, each with its seq.

use anyhow::Result;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::transcript_item::Item;

use crate::client::Client;

pub async fn transcript(client: &mut Client, id: &str) -> Result<()> {
    let mut after_seq = 0;
    loop {
        let request = pb::GetTranscriptRequest { session: Some(client.session(id)), after_seq, page_size: 0 };
        let reply = client.api.get_transcript(request).await?.into_inner();
        for item in &reply.items {
            client.print(item, &[], item_line)?;
        }
        if reply.next_seq == 0 {
            return Ok(());
        }
        after_seq = reply.next_seq;
    }
}

fn item_line(item: &pb::TranscriptItem) -> String {
    let body = match &item.item {
        Some(Item::User(u)) => {
            let delivery = match pb::DeliveryKind::try_from(u.delivery) {
                Ok(pb::DeliveryKind::Followup) => " (followup)",
                Ok(pb::DeliveryKind::Queue) => " (queue)",
                Ok(pb::DeliveryKind::Steer) => " (steer)",
                Ok(pb::DeliveryKind::Inject) => " (inject)",
                _ => "",
            };
            let text = u.message.as_ref().map(message_text).unwrap_or_default();
            format!("user{delivery}: {text}")
        }
        Some(Item::Assistant(a)) => {
            let calls: String = a.tool_calls.iter().map(|c| format!(" [calls {} {}]", c.name, c.arguments)).collect();
            let cut = if a.interrupted { " [interrupted]" } else { "" };
            format!("assistant: {}{calls}{cut}", a.text)
        }
        Some(Item::ToolCall(c)) => {
            let waiting = match (c.awaiting_approval, c.awaiting_client) {
                (true, _) => " (awaiting approval)",
                (_, true) => " (awaiting its client)",
                _ => "",
            };
            format!("tool call {} {} {}{waiting}", c.name, c.call_id, c.arguments)
        }
        Some(Item::ToolDecision(d)) => {
            let verdict = if d.approved { "approved" } else { "denied" };
            let why = if d.reason.is_empty() { String::new() } else { format!(": {}", d.reason) };
            format!("decision on {}: {verdict}{why}", d.call_id)
        }
        Some(Item::ToolResult(r)) => match &r.error {
            Some(e) => format!("tool result {} {} failed: {e}", r.name, r.call_id),
            None => format!("tool result {} {}: {}", r.name, r.call_id, r.output),
        },
        Some(Item::TurnEnd(end)) => {
            let usage = end.usage.unwrap_or_default();
            format!(
                "turn {} ended: {} ({} input, {} output tokens)",
                item.turn,
                turn_end_name(end.reason.as_ref()),
                usage.input_tokens,
                usage.output_tokens
            )
        }
        None => "(an item this client does not know)".to_owned(),
    };
    format!("#{:<4} {body}", item.seq)
}

fn message_text(m: &pb::UserMessage) -> String {
    m.content
        .iter()
        .map(|b| match &b.block {
            Some(pb::content_block::Block::Text(t)) => t.text.clone(),
            Some(pb::content_block::Block::Data(d)) => format!("[{} bytes of {}]", d.bytes.len(), d.mime),
            None => String::new(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a turn ended, without its details, as `turnstile chat` and `turnstile transcript` both print it
/// (the spelling of the model's `TurnEndReason` display: `max-tokens`).
pub(crate) fn turn_end_name(reason: Option<&pb::TurnEndReason>) -> &'static str {
    use pb::turn_end_reason::Reason;
    match reason.and_then(|r| r.reason.as_ref()) {
        Some(Reason::Completed(_)) => "completed",
        Some(Reason::Blocked(_)) => "blocked",
        Some(Reason::MaxTokens(_)) => "max-tokens",
        Some(Reason::Aborted(_)) => "aborted",
        Some(Reason::Error(_)) => "error",
        Some(Reason::Interrupted(_)) => "interrupted",
        None => "unknown",
    }
}
