//! Async turns per exact key: holders of one key go one at a time, holders of
//! different keys never wait for each other (no striping, so no false sharing).
//!
//! A key's entry lives only while someone holds or awaits its turn; the last one
//! out removes it, so the map stays as small as the current contention. The turn
//! is fair (tokio's `Mutex` is FIFO). A waiter may bound its wait ([`KeyedTurns::acquire`])
//! and gets [`TimedOut`] instead of the turn, leaving the queue behind it intact.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};

type Entries<K> = Arc<SyncMutex<HashMap<K, Arc<Mutex<()>>>>>;

/// One queue of turns per key.
pub struct KeyedTurns<K = String> {
    entries: Entries<K>,
}

/// The turn of one key; the next waiter gets it when this is dropped.
#[must_use = "the turn is given up when dropped"]
pub struct Turn<K: Hash + Eq + Clone = String> {
    // Declared first so it is released before `_claim` looks at the entry's users.
    _guard: OwnedMutexGuard<()>,
    _claim: Claim<K>,
}

/// The wait for a key's turn ended before the turn came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("timed out waiting for the turn")]
pub struct TimedOut;

impl<K: Hash + Eq + Clone> Default for KeyedTurns<K> {
    fn default() -> Self {
        KeyedTurns {
            entries: Arc::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> KeyedTurns<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits at most `max_wait` for `key`'s turn.
    pub async fn acquire(&self, key: K, max_wait: Duration) -> Result<Turn<K>, TimedOut> {
        let claim = self.claim(key);
        let lock = claim.mutex().clone().lock_owned();
        match tokio::time::timeout(max_wait, lock).await {
            Ok(guard) => Ok(Turn {
                _guard: guard,
                _claim: claim,
            }),
            // `claim` drops here and removes the entry if nobody else uses it.
            Err(_) => Err(TimedOut),
        }
    }

    /// Waits for `key`'s turn however long it takes.
    pub async fn wait(&self, key: K) -> Turn<K> {
        let claim = self.claim(key);
        let guard = claim.mutex().clone().lock_owned().await;
        Turn {
            _guard: guard,
            _claim: claim,
        }
    }

    /// Keys that someone currently holds or awaits (for tests and metrics).
    pub fn active_keys(&self) -> usize {
        lock(&self.entries).len()
    }

    fn claim(&self, key: K) -> Claim<K> {
        let mutex = lock(&self.entries).entry(key.clone()).or_default().clone();
        Claim {
            key,
            mutex: Some(mutex),
            entries: self.entries.clone(),
        }
    }
}

/// A use of a key's entry (waiting or holding); the last one dropped removes the entry.
struct Claim<K: Hash + Eq + Clone> {
    key: K,
    mutex: Option<Arc<Mutex<()>>>,
    entries: Entries<K>,
}

impl<K: Hash + Eq + Clone> Claim<K> {
    fn mutex(&self) -> &Arc<Mutex<()>> {
        self.mutex.as_ref().expect("present until drop")
    }
}

impl<K: Hash + Eq + Clone> Drop for Claim<K> {
    fn drop(&mut self) {
        let Some(mine) = self.mutex.take() else {
            return;
        };
        let mut entries = lock(&self.entries);
        drop(mine);
        // New claims clone the entry under this same lock, so a count of one (the
        // map's own reference) means no one holds or awaits this key.
        if entries
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            entries.remove(&self.key);
        }
    }
}

/// The map is only touched in short non-async sections; a panic there cannot leave it
/// half-updated, so a poisoned lock is still usable.
fn lock<K>(entries: &Entries<K>) -> std::sync::MutexGuard<'_, HashMap<K, Arc<Mutex<()>>>> {
    entries.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn one_turn_per_key_and_other_keys_never_wait() {
        let turns = KeyedTurns::<String>::new();
        let a = turns.acquire("a".into(), LONG).await.unwrap();
        // A different key, even one a striped lock might have hashed alike, is free.
        let b = turns
            .acquire("b".into(), Duration::from_millis(1))
            .await
            .unwrap();
        assert_eq!(
            turns
                .acquire("a".into(), Duration::from_millis(10))
                .await
                .err(),
            Some(TimedOut)
        );
        drop(a);
        let a2 = turns
            .acquire("a".into(), Duration::from_millis(1))
            .await
            .unwrap();
        drop((a2, b));
        assert_eq!(turns.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn entries_are_removed_when_unused_including_after_timeouts() {
        let turns = Arc::new(KeyedTurns::<String>::new());
        let held = turns.acquire("k".into(), LONG).await.unwrap();
        assert_eq!(turns.active_keys(), 1);
        let waiter = {
            let turns = turns.clone();
            tokio::spawn(async move { turns.acquire("k".into(), LONG).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        let timed_out = turns.acquire("k".into(), Duration::from_millis(5)).await;
        assert!(timed_out.is_err());
        // The timed-out waiter left; the holder and the other waiter keep the entry.
        assert_eq!(turns.active_keys(), 1);
        drop(held);
        waiter.await.unwrap().unwrap();
        assert_eq!(turns.active_keys(), 0);
        let t = turns.wait("k".into()).await;
        assert_eq!(turns.active_keys(), 1);
        drop(t);
        assert_eq!(turns.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn turns_are_handed_on_in_order() {
        let turns = Arc::new(KeyedTurns::<u32>::new());
        let order = Arc::new(SyncMutex::new(Vec::new()));
        let first = turns.acquire(7, LONG).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (turns, order) = (turns.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _t = turns.acquire(7, LONG).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::task::yield_now().await;
            }));
            // Each waiter queues before the next one is spawned.
            tokio::task::yield_now().await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(turns.active_keys(), 0);
    }
}
