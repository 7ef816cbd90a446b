//! The on-disk format of the embedded log and its crash recovery.
//!
//! One append-only file per session at `<data_dir>/sessions/<tenant>/<session>.log` (names are
//! `[A-Za-z0-9_-]`, so they are safe path components). Each *append call* is one frame:
//!
//! ```text
//! frame = [u32 LE body_len][u32 LE crc32(body)][body]
//! body  = [u32 LE count] count × ([u32 LE event_len][event bytes = codec::encode_event])
//! ```
//!
//! A frame is written with one `write_all` and made durable with `sync_data` before the append is
//! acknowledged, so a multi-event append is atomic across a crash: either its frame checks out or it is
//! a torn tail. On open, a bad frame (short, failing its checksum, or empty) with nothing but zeros after
//! it is a crash mid-append that was never acknowledged and is truncated away; a bad frame followed by
//! other data, or events that are not contiguous from seq 1 in this session, is
//! [`JournalError::Corrupt`].

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::log::JournalError;
use turnstile_model::event::Envelope;
use turnstile_model::message::SessionRef;
use turnstile_proto::codec;

const HEADER: usize = 8;
const LOG_EXT: &str = "log";

/// The `sessions/` directory of a data dir.
pub(super) struct Store {
    root: PathBuf,
}

/// What [`Store::open`] found for one session.
pub(super) struct Recovered {
    pub session: SessionRef,
    pub events: Vec<Envelope>,
    pub file: SessionFile,
}

impl Store {
    /// Creates `<data_dir>/sessions` if needed and recovers every session file in it.
    pub fn open(data_dir: &Path) -> Result<(Self, Vec<Recovered>), JournalError> {
        let root = data_dir.join("sessions");
        fs::create_dir_all(&root).map_err(|e| storage(&root, "create the sessions directory", &e))?;
        let store = Self { root };
        let mut recovered = Vec::new();
        for tenant_dir in read_dir(&store.root)? {
            if !tenant_dir.is_dir() {
                tracing::warn!(path = %tenant_dir.display(), "ignoring a non-directory in the sessions directory");
                continue;
            }
            let Some(tenant) = file_name(&tenant_dir) else { continue };
            for path in read_dir(&tenant_dir)? {
                if path.extension().and_then(|e| e.to_str()) != Some(LOG_EXT) {
                    tracing::warn!(path = %path.display(), "ignoring a file that is not a session log");
                    continue;
                }
                let Some(id) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else { continue };
                let session = SessionRef::new(tenant.clone(), id).map_err(|e| {
                    JournalError::Storage(format!(
                        "{} is not named after a valid session ({e}); move it out of the data dir",
                        path.display()
                    ))
                })?;
                recovered.push(recover(session, path)?);
            }
        }
        Ok((store, recovered))
    }

    /// The (not yet created) file of a session that has no events.
    pub fn session_file(&self, session: &SessionRef) -> SessionFile {
        let path = self.root.join(&session.tenant).join(format!("{}.{LOG_EXT}", session.id));
        SessionFile { path, file: None, len: 0, broken: None }
    }
}

/// The append end of one session's file. Opened lazily on the first append.
pub(super) struct SessionFile {
    path: PathBuf,
    file: Option<File>,
    /// Length of the valid prefix; a failed write is rolled back to it.
    len: u64,
    /// Set when a failed write could not be rolled back: the file's tail is unknown.
    broken: Option<String>,
}

impl SessionFile {
    /// Writes one frame and syncs it. On failure the file is cut back to its previous length, so a later
    /// append never lands after a partial frame.
    pub fn append(&mut self, frame: &[u8]) -> Result<(), JournalError> {
        if let Some(why) = &self.broken {
            return Err(JournalError::Storage(format!(
                "{} cannot take appends since an earlier write failed and could not be undone ({why}); restart \
                 the process so recovery truncates the torn frame",
                self.path.display()
            )));
        }
        let mut file = match self.file.take() {
            Some(file) => file,
            None => self.create()?,
        };
        let written = file.write_all(frame).and_then(|()| file.sync_data());
        let result = match written {
            Ok(()) => {
                self.len += frame.len() as u64;
                Ok(())
            }
            Err(e) => {
                if let Err(undo) = file.set_len(self.len).and_then(|()| file.sync_data()) {
                    self.broken = Some(undo.to_string());
                }
                Err(storage(&self.path, "append to the session log", &e))
            }
        };
        self.file = Some(file);
        result
    }

    /// Removes the file (`DeleteSession`) and makes the removal durable: after a crash the session is
    /// gone, not back. A file never created is nothing to remove.
    pub fn remove(&mut self) -> Result<(), JournalError> {
        self.file = None;
        match fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(storage(&self.path, "remove the session log", &e)),
        }
        self.len = 0;
        sync_dir(self.path.parent().unwrap_or(Path::new(".")))
    }

    fn create(&self) -> Result<File, JournalError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(|e| storage(dir, "create the tenant directory", &e))?;
        let existed = self.path.exists();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| storage(&self.path, "open the session log", &e))?;
        if !existed {
            // The new directory entries must be durable too, or a crash could lose an acknowledged session.
            sync_dir(dir)?;
            if let Some(root) = dir.parent() {
                sync_dir(root)?;
            }
        }
        Ok(file)
    }
}

/// One append call's events as a checksummed frame.
pub(super) fn encode_frame(events: &[Envelope]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&len_u32(events.len()).to_le_bytes());
    for event in events {
        let bytes = codec::encode_event(event);
        body.extend_from_slice(&len_u32(bytes.len()).to_le_bytes());
        body.extend_from_slice(&bytes);
    }
    let mut frame = Vec::with_capacity(HEADER + body.len());
    frame.extend_from_slice(&len_u32(body.len()).to_le_bytes());
    frame.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Lengths in a frame are u32. An event or batch of 4 GiB is far beyond any message limit, so saturating
/// only ever turns an absurd batch into a frame that fails its checksum on read.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Reads a session file, truncating a torn last frame, and returns its events.
fn recover(session: SessionRef, path: PathBuf) -> Result<Recovered, JournalError> {
    let bytes = fs::read(&path).map_err(|e| storage(&path, "read the session log", &e))?;
    let (events, valid) = parse(&session, &path, &bytes)?;
    if valid < bytes.len() {
        tracing::warn!(
            session = %session,
            path = %path.display(),
            dropped_bytes = bytes.len() - valid,
            last_seq = events.len(),
            "dropping a torn last frame: a crash interrupted an append that was never acknowledged"
        );
        let file = OpenOptions::new().write(true).open(&path).map_err(|e| storage(&path, "open for repair", &e))?;
        file.set_len(valid as u64)
            .and_then(|()| file.sync_all())
            .map_err(|e| storage(&path, "truncate the torn frame", &e))?;
    }
    let file = SessionFile { path, file: None, len: valid as u64, broken: None };
    Ok(Recovered { session, events, file })
}

/// The events of a file's valid frames and the length of that valid prefix.
fn parse(session: &SessionRef, path: &Path, bytes: &[u8]) -> Result<(Vec<Envelope>, usize), JournalError> {
    let mut events: Vec<Envelope> = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let next_seq = events.len() as u64 + 1;
        let corrupt = |detail: String| JournalError::Corrupt {
            session: session.clone(),
            seq: next_seq,
            detail: format!("{} at byte {pos}: {detail}", path.display()),
        };
        let frame = match read_frame(&bytes[pos..]) {
            Ok(frame) => frame,
            Err(bad) => {
                let end = pos.saturating_add(bad.claimed_end).min(bytes.len());
                if bytes[end..].iter().all(|b| *b == 0) {
                    return Ok((events, pos));
                }
                return Err(corrupt(format!("{}, and data follows it", bad.why)));
            }
        };
        let batch = decode_body(frame.body).map_err(&corrupt)?;
        for event in batch {
            if event.session != *session {
                return Err(corrupt(format!("event of another session {}", event.session)));
            }
            if event.seq != events.len() as u64 + 1 {
                return Err(corrupt(format!("event has seq {} where {} belongs", event.seq, events.len() + 1)));
            }
            events.push(event);
        }
        pos += frame.len;
    }
    Ok((events, pos))
}

struct Frame<'a> {
    body: &'a [u8],
    /// Header plus body.
    len: usize,
}

/// Why the bytes at a position are not a good frame, and where that frame would have ended.
struct BadFrame {
    why: &'static str,
    claimed_end: usize,
}

fn read_frame(bytes: &[u8]) -> Result<Frame<'_>, BadFrame> {
    let Some((len, crc)) = bytes.get(..HEADER).map(|h| (le_u32(&h[..4]) as usize, le_u32(&h[4..]))) else {
        return Err(BadFrame { why: "short frame header", claimed_end: bytes.len() });
    };
    let end = HEADER.saturating_add(len);
    let Some(body) = bytes.get(HEADER..end) else {
        return Err(BadFrame { why: "frame runs past the end of the file", claimed_end: bytes.len() });
    };
    if len == 0 {
        // A batch always has a count; an all-zero header is what a preallocated, never-written tail reads as.
        return Err(BadFrame { why: "empty frame", claimed_end: end });
    }
    if crc32fast::hash(body) != crc {
        return Err(BadFrame { why: "frame fails its checksum", claimed_end: end });
    }
    Ok(Frame { body, len: end })
}

/// A checksummed body that does not decode is not a torn write: it is corrupt.
fn decode_body(mut body: &[u8]) -> Result<Vec<Envelope>, String> {
    let count = take_u32(&mut body).ok_or("frame body has no event count")? as usize;
    let mut events = Vec::with_capacity(count.min(1024));
    for i in 0..count {
        let len = take_u32(&mut body).ok_or_else(|| format!("event {i} of {count} has no length"))? as usize;
        let bytes = body.get(..len).ok_or_else(|| format!("event {i} of {count} is cut short"))?;
        events.push(codec::decode_event(bytes).map_err(|e| format!("event {i} of {count}: {e}"))?);
        body = &body[len..];
    }
    if !body.is_empty() {
        return Err(format!("{} stray bytes after {count} events", body.len()));
    }
    if events.is_empty() {
        return Err("frame holds no events".into());
    }
    Ok(events)
}

fn take_u32(bytes: &mut &[u8]) -> Option<u32> {
    let (head, rest) = bytes.split_at_checked(4)?;
    *bytes = rest;
    Some(le_u32(head))
}

/// `bytes` is exactly 4 long at every call site.
fn le_u32(bytes: &[u8]) -> u32 {
    let mut buf = [0u8; 4];
    buf.copy_from_slice(bytes);
    u32::from_le_bytes(buf)
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, JournalError> {
    let entries = fs::read_dir(dir).map_err(|e| storage(dir, "list", &e))?;
    entries.map(|entry| entry.map(|e| e.path()).map_err(|e| storage(dir, "list", &e))).collect()
}

fn file_name(path: &Path) -> Option<String> {
    path.file_name().and_then(|n| n.to_str()).map(str::to_owned)
}

fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| storage(dir, "sync the directory", &e))
}

fn storage(path: &Path, action: &str, e: &std::io::Error) -> JournalError {
    JournalError::Storage(format!(
        "cannot {action} {}: {e}; check the data dir's permissions and free space",
        path.display()
    ))
}
