// A page that reads the API again and again while it is shown: the sessions list, the approvals inbox and
// an agent's page refresh every few seconds until the router leaves them.

/// How long a refreshing page waits between the end of one read and the start of the next.
export const REFRESH_MS = 3000;

/// A page's refresh. `every(load)` runs `load` now and again after each run ends, until the page is left;
/// `shown()` is false from then on, and a reply that arrives later must write nothing (its elements may be
/// gone, or another page's).
export class Refresh {
  #left = false;

  readonly shown = (): boolean => !this.#left;

  /// Starts the loop; returns the page's leave (what the router calls when another page is shown).
  every(load: () => Promise<void>, ms = REFRESH_MS): () => void {
    void (async () => {
      while (!this.#left) {
        await load();
        await new Promise((r) => setTimeout(r, ms));
      }
    })();
    return () => {
      this.#left = true;
    };
  }
}
