//! A bounded FIFO of pending writes ([`Lane`]), each standing for some rows
//! and bytes: pushing past its [`Bounds`] drops the oldest writes not in
//! flight. Pure data, no I/O and no lock; the metering outbox and the
//! stdout row queue each wrap one in their own lock.

use std::collections::VecDeque;
use std::time::Duration;

/// Default bound on the rows one outbox (or the stdout row queue) keeps.
pub const MAX_ROWS: usize = 100_000;
/// Default bound on their approximate size.
pub const MAX_BYTES: usize = 64 * 1024 * 1024;
/// How often a queue's `settle` looks at the queue.
pub const SETTLE_POLL: Duration = Duration::from_millis(10);
/// The bound of a queue of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_rows: usize,
    pub max_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_rows: MAX_ROWS,
            max_bytes: MAX_BYTES,
        }
    }
}

/// A FIFO of items that each stand for some rows and bytes, bounded by
/// [`Bounds`]: pushing past the bound drops the oldest items that are not
/// in flight. Pure data; the outbox and the stdout row queue wrap it in
/// their own locks.
#[derive(Debug)]
pub struct Lane<T> {
    items: VecDeque<Item<T>>,
    rows: usize,
    bytes: usize,
    next_id: u64,
    bounds: Bounds,
}

#[derive(Debug)]
struct Item<T> {
    id: u64,
    item: T,
    rows: usize,
    bytes: usize,
    /// Sent to the store and not answered yet: its fate is the store's
    /// answer, so the bound does not drop it (the replay's batch at most
    /// can stand over the bound for one round trip).
    in_flight: bool,
}

impl<T> Lane<T> {
    pub fn new(bounds: Bounds) -> Self {
        Self {
            items: VecDeque::new(),
            rows: 0,
            bytes: 0,
            next_id: 0,
            bounds,
        }
    }

    /// Appends `item`; returns its id and the items dropped (oldest first)
    /// to get back within the bound (which can include `item` itself when
    /// it alone is over the bound). Items in flight are never dropped.
    pub fn push(&mut self, item: T, rows: usize, bytes: usize) -> (u64, Vec<(T, usize)>) {
        let id = self.next_id;
        self.next_id += 1;
        self.items.push_back(Item {
            id,
            item,
            rows,
            bytes,
            in_flight: false,
        });
        self.rows += rows;
        self.bytes += bytes;
        let mut dropped = Vec::new();
        while self.rows > self.bounds.max_rows || self.bytes > self.bounds.max_bytes {
            let Some(at) = self.items.iter().position(|i| !i.in_flight) else {
                break;
            };
            if let Some(i) = self.items.remove(at) {
                self.rows -= i.rows;
                self.bytes -= i.bytes;
                dropped.push((i.item, i.rows));
            }
        }
        (id, dropped)
    }

    /// Up to `n` items from the front, with their ids.
    pub fn front(&self, n: usize) -> Vec<(u64, &T)> {
        self.items.iter().take(n).map(|i| (i.id, &i.item)).collect()
    }

    /// Marks the item `id`, if still queued, as sent to the store (`true`)
    /// or back to waiting (`false`).
    pub fn set_in_flight(&mut self, id: u64, in_flight: bool) {
        if let Some(i) = self.items.iter_mut().find(|i| i.id == id) {
            i.in_flight = in_flight;
        }
    }

    /// Removes the item `id` if it is still queued.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let at = self.items.iter().position(|i| i.id == id)?;
        let i = self.items.remove(at)?;
        self.rows -= i.rows;
        self.bytes -= i.bytes;
        Some(i.item)
    }

    /// Takes every item (oldest first).
    pub fn take_all(&mut self) -> Vec<(T, usize)> {
        self.rows = 0;
        self.bytes = 0;
        self.items.drain(..).map(|i| (i.item, i.rows)).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
