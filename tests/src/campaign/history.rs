//! The campaign's history: every call with its outcome, every fault with its times, and the JSONL files
//! they are written to.

use std::io::Write as _;

use tonic::Code;

/// The answer a call got.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Answered OK; the seq of the reply (0 where the reply has none).
    Ok(u64),
    Err(Code, String),
    /// No answer by deadline + grace; the client gave up.
    Hung,
}

impl Outcome {
    /// Whether the call may have been applied although it did not say so.
    pub(super) fn maybe(&self) -> bool {
        match self {
            Outcome::Ok(_) => false,
            Outcome::Hung => true,
            Outcome::Err(code, _) => !matches!(
                code,
                Code::InvalidArgument
                    | Code::FailedPrecondition
                    | Code::NotFound
                    | Code::AlreadyExists
                    | Code::ResourceExhausted
                    | Code::OutOfRange
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::Unimplemented
            ),
        }
    }

    pub(super) fn label(&self) -> String {
        match self {
            Outcome::Ok(_) => "OK".into(),
            Outcome::Err(code, _) => format!("{code:?}"),
            Outcome::Hung => "HUNG".into(),
        }
    }
}

/// One client call and its answer.
#[derive(Clone, Debug)]
pub struct CallRecord {
    pub client: usize,
    pub session: usize,
    pub kind: &'static str,
    /// The MessageId the call delivers, replaces or removes.
    pub id: Option<String>,
    pub gateway: usize,
    /// Milliseconds since the campaign started.
    pub start_ms: u64,
    pub end_ms: u64,
    /// Wall clock of the start (to compare with event times).
    pub start_unix_ms: u64,
    pub deadline_ms: u64,
    pub outcome: Outcome,
}

/// One injected fault.
#[derive(Clone, Debug)]
pub struct FaultRecord {
    pub kind: &'static str,
    pub target: usize,
    pub start_ms: u64,
    pub end_ms: u64,
    /// For a cut of a NATS node with its worker: ms from the cut until the other workers owned every
    /// shard (`None`: not within [`TAKEOVER_BOUND`], a violation), and the shards the cut-off worker
    /// still reported owning when the cut healed.
    pub takeover_ms: Option<u64>,
    pub inner_owned_at_heal: Option<u64>,
}

pub(super) fn write_history(
    dir: &std::path::Path,
    history: &[CallRecord],
    faults: &[FaultRecord],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join("history.jsonl"))?);
    for c in history {
        let (answer, seq, message) = match &c.outcome {
            Outcome::Ok(seq) => ("OK".to_owned(), Some(*seq), String::new()),
            Outcome::Err(code, m) => (format!("{code:?}"), None, m.clone()),
            Outcome::Hung => ("HUNG".to_owned(), None, String::new()),
        };
        let line = serde_json::json!({
            "client": c.client, "session": c.session, "kind": c.kind, "id": c.id, "gateway": c.gateway,
            "start_ms": c.start_ms, "end_ms": c.end_ms, "deadline_ms": c.deadline_ms,
            "answer": answer, "seq": seq, "message": message,
        });
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join("faults.jsonl"))?);
    for f in faults {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "kind": f.kind, "target": f.target, "start_ms": f.start_ms, "end_ms": f.end_ms,
                "takeover_ms": f.takeover_ms, "inner_owned_at_heal": f.inner_owned_at_heal,
            })
        )?;
    }
    out.flush()
}
