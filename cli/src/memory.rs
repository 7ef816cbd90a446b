//! `memory put|get|list|search|delete` (SPEC §20): the tenant's memory, JSON documents in namespaces.

use anyhow::{Context, Result};
use turnstile_proto::v1 as pb;

use crate::args::{MemoryKeyArgs, MemoryListArgs, MemoryPutArgs, MemorySearchArgs};
use crate::client::{Client, print_pages};

fn document_line(d: &pb::MemoryDocument) -> String {
    let by = if d.written_by.is_empty() { String::new() } else { format!(" written_by={}", d.written_by) };
    format!("{}/{} revision={}{by} {}", d.namespace, d.key, d.revision, d.document)
}

pub async fn put(client: &mut Client, a: MemoryPutArgs) -> Result<()> {
    let document = match a.document.as_deref() {
        Some("-") | None => std::io::read_to_string(std::io::stdin()).context("cannot read the document from stdin")?,
        Some(text) => text.to_owned(),
    };
    let request = pb::PutMemoryRequest {
        tenant: client.tenant.clone(),
        namespace: a.at.namespace,
        key: a.at.key,
        document: document.trim_end().to_owned(),
    };
    let written = client.api.put_memory(request).await?.into_inner();
    client.print(&written, &[], document_line)
}

pub async fn get(client: &mut Client, a: MemoryKeyArgs) -> Result<()> {
    let request = pb::GetMemoryRequest { tenant: client.tenant.clone(), namespace: a.namespace, key: a.key };
    let document = client.api.get_memory(request).await?.into_inner();
    client.print(&document, &[], |d| d.document.clone())
}

pub async fn delete(client: &mut Client, a: MemoryKeyArgs) -> Result<()> {
    let request = pb::DeleteMemoryRequest { tenant: client.tenant.clone(), namespace: a.namespace, key: a.key };
    let document = client.api.delete_memory(request).await?.into_inner();
    client.print(&document, &[], document_line)
}

/// Every page, one document a line.
pub async fn list(client: &mut Client, a: MemoryListArgs) -> Result<()> {
    print_pages(client, document_line, async |client, page_token| {
        let request = pb::ListMemoryRequest {
            tenant: client.tenant.clone(),
            namespace: a.namespace.clone().unwrap_or_default(),
            prefix: a.prefix.clone(),
            page_size: 0,
            page_token,
        };
        let reply = client.api.list_memory(request).await?.into_inner();
        Ok((reply.documents, reply.next_page_token))
    })
    .await
}

pub async fn search(client: &mut Client, a: MemorySearchArgs) -> Result<()> {
    let request = pb::SearchMemoryRequest {
        tenant: client.tenant.clone(),
        namespaces: a.namespaces,
        query: a.query.join(" "),
        limit: a.limit,
    };
    for hit in client.api.search_memory(request).await?.into_inner().hits {
        client.print(&hit, &[], |h| {
            let line = h.document.as_ref().map(document_line).unwrap_or_default();
            format!("{:.3} {line}", h.score)
        })?;
    }
    Ok(())
}
