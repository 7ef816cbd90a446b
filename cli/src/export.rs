//! `turnstile export` and `turnstile import` (SPEC §18): an export stream to a file or stdout and back.
//!
//! The file is the `ExportSessions` stream as it came: each `ExportItem` length-delimited (a varint length,
//! then the message), so an import sends the same items back in order without holding the file in memory.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use prost::Message as _;
use tokio::sync::mpsc;
use turnstile_proto::v1 as pb;
use turnstile_proto::v1::export_item::Item;

use crate::client::Client;

/// Items read ahead of the import stream.
const READ_AHEAD: usize = 16;
/// The largest item read from a file: the gateway refuses larger requests anyway.
const MAX_ITEM_BYTES: u64 = 64 << 20;

/// `export [SESSION…] [--out FILE]`: writes the stream, then says what it wrote on stderr (stdout may be
/// the export itself).
pub async fn export(client: &mut Client, sessions: &[String], out: Option<&Path>) -> Result<()> {
    let request = pb::ExportSessionsRequest { tenant: client.tenant.clone(), sessions: sessions.to_vec() };
    let mut stream = client.api.export_sessions(request).await?.into_inner();
    let target = out.filter(|p| *p != Path::new("-"));
    let partial = target.map(|p| PathBuf::from(format!("{}.partial", p.display())));
    let mut writer: BufWriter<Box<dyn Write>> = BufWriter::new(match &partial {
        Some(path) => {
            Box::new(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?)
        }
        None => Box::new(std::io::stdout()),
    });
    let (mut sessions_written, mut events, mut memory, mut tenant) = (0u64, 0u64, 0u64, String::new());
    let copied: Result<()> = async {
        while let Some(item) = stream.message().await? {
            match &item.item {
                Some(Item::Header(h)) => tenant.clone_from(&h.tenant),
                Some(Item::Events(g)) => events += g.events.len() as u64,
                Some(Item::End(_)) => sessions_written += 1,
                Some(Item::Memory(_)) => memory += 1,
                None => {}
            }
            writer.write_all(&item.encode_length_delimited_to_vec()).context("cannot write the export")?;
        }
        writer.flush().context("cannot write the export")
    }
    .await;
    drop(writer);
    if let Err(e) = copied {
        // An export that failed part-way is no export: leave nothing that looks like one.
        if let Some(partial) = &partial {
            let _ = std::fs::remove_file(partial);
        }
        return Err(e);
    }
    let whereto = match (target, partial) {
        (Some(target), Some(partial)) => {
            std::fs::rename(&partial, target)
                .with_context(|| format!("cannot rename {} to {}", partial.display(), target.display()))?;
            target.display().to_string()
        }
        _ => "stdout".to_owned(),
    };
    let memory = if memory > 0 { format!(" and {memory} memory documents") } else { String::new() };
    eprintln!("exported {sessions_written} sessions ({events} events){memory} of tenant {tenant} to {whereto}");
    Ok(())
}

/// `import [FILE]`: streams the file's items to `ImportSessions` as they are read.
pub async fn import(client: &mut Client, file: Option<&Path>) -> Result<()> {
    let source = file.filter(|p| *p != Path::new("-"));
    let (name, input): (String, Box<dyn Read + Send>) = match source {
        Some(path) => {
            let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            (path.display().to_string(), Box::new(f))
        }
        None => ("stdin".to_owned(), Box::new(std::io::stdin())),
    };
    let (tx, rx) = mpsc::channel(READ_AHEAD);
    let what = name.clone();
    let reader = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut input = BufReader::new(input);
        let mut n = 0usize;
        while let Some(item) = read_item(&mut input).with_context(|| format!("{what}: item {}", n + 1))? {
            n += 1;
            if tx.blocking_send(item).is_err() {
                // The call ended (its error is what the user sees).
                return Ok(());
            }
        }
        if n == 0 {
            bail!("{what} is empty: it holds no export");
        }
        Ok(())
    });
    let items = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let reply = client.api.import_sessions(items).await;
    // A file that cannot be read is the error to report, whatever the server answered to the cut stream.
    reader.await.context("the reader of the export stopped")??;
    let reply = reply?.into_inner();
    client.print(&reply, &[], |r| {
        let memory = if r.memory_documents > 0 {
            format!(" and {} memory documents", r.memory_documents)
        } else {
            String::new()
        };
        format!("imported {} sessions ({} events){memory} from {name}", r.sessions, r.events)
    })
}

/// The next length-delimited item, `None` at a clean end of the input.
fn read_item(input: &mut impl BufRead) -> Result<Option<pb::ExportItem>> {
    if input.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let mut len: u64 = 0;
    for shift in (0..64).step_by(7) {
        let mut byte = [0u8];
        input.read_exact(&mut byte).context("the file ends inside an item's length: it is truncated")?;
        len |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            break;
        }
    }
    if len > MAX_ITEM_BYTES {
        bail!("an item of {len} bytes: this is not an export written by `turnstile export`");
    }
    let mut bytes = vec![0; usize::try_from(len)?];
    input.read_exact(&mut bytes).context("the file ends inside an item: it is truncated")?;
    Ok(Some(pb::ExportItem::decode(bytes.as_slice()).context("not an export written by `turnstile export`")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_read_back_in_order_and_a_cut_file_is_an_error() {
        let items = [
            pb::ExportItem {
                item: Some(Item::Header(pb::ExportHeader { format: 1, tenant: "acme".into(), exported_unix_ms: 5 })),
            },
            pb::ExportItem { item: Some(Item::End(pb::ExportedSession { session: None, last_seq: 300 })) },
        ];
        let bytes: Vec<u8> = items.iter().flat_map(prost::Message::encode_length_delimited_to_vec).collect();
        let mut input = BufReader::new(bytes.as_slice());
        assert_eq!(read_item(&mut input).unwrap().as_ref(), Some(&items[0]));
        assert_eq!(read_item(&mut input).unwrap().as_ref(), Some(&items[1]));
        assert!(read_item(&mut input).unwrap().is_none());
        let cut = &bytes[..bytes.len() - 1];
        let mut input = BufReader::new(cut);
        read_item(&mut input).unwrap();
        assert!(read_item(&mut input).unwrap_err().to_string().contains("truncated"));
    }
}
