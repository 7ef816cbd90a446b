// A tenant's memory (#/memory, SPEC §20): its documents by namespace and key prefix, a word search, and
// one document at a time, with who wrote it (an agent's session and call, or the API).

import { client, describe, settings } from "./api";
import { byId, fill, h } from "./dom";
import type { MemoryDocument } from "@turnstile/client/browser";

function row(d: MemoryDocument, score?: number) {
  const by = d.writtenBy
    ? h("a", { href: `#/s/${encodeURIComponent(d.writtenBy.split("/")[1] ?? "")}` }, d.writtenBy)
    : h("span", { class: "muted" }, "API");
  return h("tr", { "data-key": `${d.namespace}/${d.key}` },
    h("td", {}, d.namespace),
    h("td", {}, d.key),
    h("td", {}, h("code", {}, d.document.length > 200 ? `${d.document.slice(0, 200)}…` : d.document)),
    h("td", {}, by),
    h("td", {}, score === undefined ? String(d.revision) : score.toFixed(3)));
}

export function memoryPage(root: HTMLElement): () => void {
  const namespace = h("input", { id: "memory-namespace", placeholder: "namespace (all)" }) as HTMLInputElement;
  const prefix = h("input", { id: "memory-prefix", placeholder: "key prefix" }) as HTMLInputElement;
  const query = h("input", { id: "memory-query", placeholder: "words to search" }) as HTMLInputElement;
  const table = h("table", { id: "memory" },
    h("thead", {}, h("tr", {}, ["namespace", "key", "document", "written by", "revision / score"].map((c) => h("th", {}, c)))),
    h("tbody", {}));
  const show = (rows: HTMLElement[], empty: string) => {
    const body = table.querySelector("tbody");
    if (body) fill(body, rows.length ? rows : h("tr", {}, h("td", { colspan: 5, class: "muted" }, empty)));
  };
  const list = async () => {
    try {
      const documents: MemoryDocument[] = [];
      let pageToken = "";
      do {
        const reply = await client.listMemory({ tenant: settings.tenant, namespace: namespace.value.trim(), prefix: prefix.value, pageToken, pageSize: 500 });
        documents.push(...reply.documents);
        pageToken = reply.nextPageToken;
      } while (pageToken && documents.length < 2000);
      byId("memory-error").textContent = "";
      show(documents.map((d) => row(d)), "no documents: agents write them with memory_put, applications with PutMemory");
    } catch (e) {
      byId("memory-error").textContent = `ListMemory failed: ${describe(e)}`;
    }
  };
  const search = async () => {
    try {
      const ns = namespace.value.trim();
      const reply = await client.searchMemory(query.value, { tenant: settings.tenant, namespaces: ns ? [ns] : [], limit: 50 });
      byId("memory-error").textContent = "";
      show(reply.hits.flatMap((hit) => (hit.document ? [row(hit.document, hit.score)] : [])), "nothing matches these words");
    } catch (e) {
      byId("memory-error").textContent = `SearchMemory failed: ${describe(e)}`;
    }
  };
  fill(root,
    h("section", { id: "memory-page" },
      h("h2", {}, "Memory"),
      h("form", { id: "memory-list", class: "row", onsubmit: (ev: Event) => { ev.preventDefault(); void list(); } },
        namespace, prefix, h("button", { id: "memory-list-button", type: "submit" }, "list")),
      h("form", { id: "memory-search", class: "row", onsubmit: (ev: Event) => { ev.preventDefault(); void search(); } },
        query, h("button", { id: "memory-search-button", type: "submit" }, "search")),
      h("div", { id: "memory-error", class: "error" }),
      table));
  void list();
  return () => {};
}
