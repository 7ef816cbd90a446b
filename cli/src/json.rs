//! `--json`: every client command's reply, and every Watch item, printed as one line in the protobuf JSON
//! mapping (lowerCamelCase field names, enum value names, 64-bit integers as strings, default values left
//! out), the same JSON that grpcurl or any protobuf library prints for that message. One place for every
//! command: a new command's reply only has to be a generated message (they all implement `prost::Name`).
//!
//! The mapping comes from the descriptors compiled into `turnstile-proto` (prost-reflect), so it follows
//! the protos with no second schema to keep in step.

use std::sync::LazyLock;

use anyhow::{Context, Result, anyhow};
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value;

static POOL: LazyLock<Result<DescriptorPool, String>> =
    LazyLock::new(|| DescriptorPool::decode(turnstile_proto::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string()));

/// `message` as a JSON value in the protobuf JSON mapping.
pub fn value<M: prost::Message + prost::Name>(message: &M) -> Result<Value> {
    let pool = POOL.as_ref().map_err(|e| anyhow!("the compiled-in protobuf descriptors do not decode: {e}"))?;
    let name = M::full_name();
    let descriptor =
        pool.get_message_by_name(&name).ok_or_else(|| anyhow!("no descriptor for {name} in the compiled-in set"))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .with_context(|| format!("re-decoding a {name}"))?;
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &SerializeOptions::new())
        .with_context(|| format!("{name} as JSON"))
}

/// `message` as one line of JSON.
pub fn line<M: prost::Message + prost::Name>(message: &M) -> Result<String> {
    Ok(value(message)?.to_string())
}

/// `message` as one line of JSON with `extra` keys added at the top level (what the client knows that
/// the reply does not carry, such as the MessageId a delivery minted).
pub fn line_with<M: prost::Message + prost::Name>(message: &M, extra: &[(&str, Value)]) -> Result<String> {
    let mut value = value(message)?;
    if let Value::Object(map) = &mut value {
        for (key, v) in extra {
            map.insert((*key).to_owned(), v.clone());
        }
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;
    use turnstile_proto::v1 as pb;

    use super::*;

    #[test]
    fn messages_print_in_the_protobuf_json_mapping() {
        let message = pb::UserMessage {
            id: "m1".into(),
            content: vec![pb::ContentBlock {
                block: Some(pb::content_block::Block::Text(pb::TextBlock { text: "hi".into() })),
            }],
            source: Some(pb::MessageSource { kind: Some(pb::message_source::Kind::User(pb::UserSource {})) }),
        };
        let inbox = pb::InboxSnapshot { seq: 7, next_turn: vec![message], next_step: vec![] };
        assert_eq!(
            value(&inbox).unwrap(),
            json!({"seq": "7", "nextTurn": [{"id": "m1", "content": [{"text": {"text": "hi"}}], "source": {"user": {}}}]})
        );
        let info = pb::SessionInfo {
            session: Some(pb::SessionRef { tenant: "t".into(), id: "s".into() }),
            status: pb::SessionStatus::Idle as i32,
            last_seq: 10,
            ..Default::default()
        };
        assert_eq!(
            value(&info).unwrap(),
            json!({"session": {"tenant": "t", "id": "s"}, "status": "SESSION_STATUS_IDLE", "lastSeq": "10"})
        );
        let reply = pb::SendReply { seq: 3, turn: Some(1) };
        assert_eq!(line_with(&reply, &[("id", json!("m1"))]).unwrap(), r#"{"id":"m1","seq":"3","turn":"1"}"#);
    }
}
