//! The one mapping between [`CommandError`] and gRPC statuses, in both directions.
//!
//! The public gateway answers clients with [`command_status`]; the worker answers the gateway with the
//! same function, and the gateway rebuilds the worker's exact error with [`command_error`]. The metadata
//! keys and the kind names are in [`crate::codec`].

use tonic::metadata::{AsciiMetadataKey, KeyAndValueRef, MetadataMap, MetadataValue};
use tonic::{Code, Status};
use turnstile_model::CommandError;
use turnstile_proto::cluster::v1 as cpb;

use crate::codec::{ERROR_KEY, OWNER_KEY, SESSION_KEY, command_error_from_parts, command_error_parts};

/// How [`CommandError::Internal`] displays before its payload.
const INTERNAL_PREFIX: &str = "internal error: ";

/// The gRPC code of a [`CommandError`]. Not-owner is UNAVAILABLE: retryable, and safe to retry with the
/// same MessageId.
pub fn command_code(err: &CommandError) -> Code {
    Code::from_i32(err.grpc_code())
}

/// `err` as a status: its code, its message (which already says what was wrong and what to do), and its
/// kind (plus session and owner for not-owner) in the metadata, from which [`command_error`] rebuilds it.
pub fn command_status(err: &CommandError) -> Status {
    let parts = command_error_parts(err);
    let message = match err {
        // A client that meets not-owner (a shard moving under `turnstile dev --nats`, say) may retry.
        CommandError::NotOwner { .. } => format!("{err}; retry the request (the same MessageId is safe)"),
        // The display (`internal error: …`) is what clients see; [`command_error`] takes the prefix off.
        _ => err.to_string(),
    };
    let mut metadata = MetadataMap::new();
    metadata.insert(ERROR_KEY, MetadataValue::from_static(parts.kind));
    // Session names and socket addresses are ASCII by construction; a value that is not (a hand-made
    // advertise address, say) is left out, and the receiver treats the owner as unknown.
    for (key, value) in [(SESSION_KEY, parts.session), (OWNER_KEY, parts.owner)] {
        if let Some(value) = value.and_then(|v| MetadataValue::try_from(v.as_str()).ok()) {
            metadata.insert(key, value);
        }
    }
    Status::with_metadata(command_code(err), message, metadata)
}

/// The [`CommandError`] a [`command_status`] carries; `None` for a status without the error kind (a
/// transport failure, a proxy's answer), which the caller handles by its code.
pub fn command_error(status: &Status) -> Option<CommandError> {
    let get = |key: &str| status.metadata().get(key).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let kind = get(ERROR_KEY)?;
    let message = status.message();
    let payload = if kind == "internal" { message.strip_prefix(INTERNAL_PREFIX).unwrap_or(message) } else { message };
    command_error_from_parts(&kind, payload.to_owned(), get(SESSION_KEY), get(OWNER_KEY))
}

/// `status` as data, for a call answered on an `ExecuteStream` (decision 0185): its code, message and the
/// ASCII entries of its metadata (every key [`command_status`] writes; binary entries are left out).
pub fn status_to_pb(status: &Status) -> cpb::ExecuteStatus {
    let metadata = status
        .metadata()
        .iter()
        .filter_map(|entry| match entry {
            KeyAndValueRef::Ascii(key, value) => Some((key.as_str().to_owned(), value.to_str().ok()?.to_owned())),
            KeyAndValueRef::Binary(..) => None,
        })
        .collect();
    cpb::ExecuteStatus { code: status.code() as i32, message: status.message().to_owned(), metadata }
}

/// The status [`status_to_pb`] carries, as `Execute` would have ended with it. An entry that is not valid
/// metadata (only a peer that does not follow [`status_to_pb`] sends one) is left out.
pub fn status_from_pb(status: cpb::ExecuteStatus) -> Status {
    let mut metadata = MetadataMap::new();
    for (key, value) in status.metadata {
        if let (Ok(key), Ok(value)) = (AsciiMetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value)) {
            metadata.insert(key, value);
        }
    }
    Status::with_metadata(Code::from_i32(status.code), status.message, metadata)
}

/// A copy of `status` (a [`Status`] is not `Clone`): its code, message and metadata.
pub fn copy_status(status: &Status) -> Status {
    Status::with_metadata(status.code(), status.message(), status.metadata().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_survives_the_round_trip_with_its_code() {
        let cases = [
            (CommandError::InvalidArgument("bad".into()), Code::InvalidArgument),
            (CommandError::NotFound("no such id".into()), Code::NotFound),
            (CommandError::AlreadyExists("dup".into()), Code::AlreadyExists),
            (CommandError::FailedPrecondition("turn 3 is running".into()), Code::FailedPrecondition),
            (CommandError::ResourceExhausted("full".into()), Code::ResourceExhausted),
            (CommandError::Unavailable("down".into()), Code::Unavailable),
            (CommandError::DeadlineExceeded("late".into()), Code::DeadlineExceeded),
            (CommandError::Internal("bug".into()), Code::Internal),
            (
                CommandError::NotOwner { session: "acme/s1".into(), owner: Some("127.0.0.1:7501".into()) },
                Code::Unavailable,
            ),
            (CommandError::NotOwner { session: "acme/s1".into(), owner: None }, Code::Unavailable),
        ];
        for (err, code) in cases {
            let status = command_status(&err);
            assert_eq!(status.code(), code, "{err:?}");
            if !matches!(err, CommandError::NotOwner { .. }) {
                assert_eq!(status.message(), err.to_string());
            }
            // Through a second hop (gateway → client of another gateway) nothing is added twice.
            assert_eq!(command_error(&command_status(&command_error(&status).unwrap())), Some(err.clone()));
            assert_eq!(command_error(&status), Some(err));
        }
    }

    #[test]
    fn a_status_crosses_a_command_stream_as_it_would_end_a_unary_call() {
        let not_owner = CommandError::NotOwner { session: "acme/s1".into(), owner: Some("127.0.0.1:7501".into()) };
        let mut status = command_status(&not_owner);
        status.metadata_mut().insert(crate::codec::API_KEY, MetadataValue::from(3u32));
        let back = status_from_pb(status_to_pb(&status));
        assert_eq!(back.code(), status.code());
        assert_eq!(back.message(), status.message());
        assert_eq!(command_error(&back), Some(not_owner));
        assert_eq!(back.metadata().get(crate::codec::API_KEY).and_then(|v| v.to_str().ok()), Some("3"));
        // A transport status (no kind) stays one.
        let refused = status_from_pb(status_to_pb(&Status::unavailable("connection refused")));
        assert_eq!((refused.code(), command_error(&refused)), (Code::Unavailable, None));
    }

    #[test]
    fn a_status_without_the_kind_is_not_a_command_error() {
        assert_eq!(command_error(&Status::unavailable("connection refused")), None);
    }
}
