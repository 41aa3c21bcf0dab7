//! Counted commit hints, for a store that pushes them ([`crate::EventStore::commit_hints`]):
//! whatever tells the store of other writers' commits (a listener, a poller) holds the
//! [`Hinter`] and counts a hint at each; the store keeps the [`Hinted`] and gives each caller a
//! stream of the hints counted after it asked. The streams end once the [`Hinter`] is dropped
//! (the listener's or poller's end). Feature `hints`.

use async_trait::async_trait;
use tokio::sync::watch;

use crate::store::CommitHints;

/// A new pair: the counting side, and the side streams are taken from.
pub fn channel() -> (Hinter, Hinted) {
    let (tx, rx) = watch::channel(0);
    (Hinter(tx), Hinted(rx))
}

/// Counts hints ([`channel`]).
#[derive(Debug)]
pub struct Hinter(watch::Sender<u64>);

impl Hinter {
    /// Counts one hint: every stream taken before it wakes (several counted before a stream
    /// looks are one hint to it).
    pub fn hint(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Gives streams of the hints a [`Hinter`] counts ([`channel`]).
#[derive(Debug, Clone)]
pub struct Hinted(watch::Receiver<u64>);

impl Hinted {
    /// A stream of the hints counted from now on.
    pub fn stream(&self) -> Box<dyn CommitHints> {
        let mut rx = self.0.clone();
        rx.borrow_and_update();
        Box::new(Stream(rx))
    }

    /// The hints counted so far.
    pub fn given(&self) -> u64 {
        *self.0.borrow()
    }
}

/// One caller's stream of hints.
struct Stream(watch::Receiver<u64>);

#[async_trait]
impl CommitHints for Stream {
    async fn next(&mut self) -> bool {
        // Fails once the hinter is gone.
        self.0.changed().await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream wakes for the hints counted after it was taken, once for several counted
    /// before it looks, and ends once the hinter is dropped (after the hints it had not taken).
    #[tokio::test]
    async fn a_stream_takes_the_hints_counted_after_it_and_ends_with_the_hinter() {
        let (hinter, hinted) = channel();
        hinter.hint();
        let mut stream = hinted.stream();
        let ready = async |s: &mut Box<dyn CommitHints>| at_once(s.next()).await;
        assert_eq!(ready(&mut stream).await, None, "the hint before it");
        hinter.hint();
        hinter.hint();
        assert_eq!(ready(&mut stream).await, Some(true));
        assert_eq!(ready(&mut stream).await, None, "two hints are one to it");
        assert_eq!(hinted.given(), 3);
        hinter.hint();
        drop(hinter);
        assert_eq!(ready(&mut stream).await, Some(true), "the last hint");
        assert_eq!(ready(&mut stream).await, Some(false), "then the end");
    }

    /// The future's answer if it has one at once.
    async fn at_once<T>(f: impl std::future::Future<Output = T>) -> Option<T> {
        let mut f = std::pin::pin!(f);
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match f.as_mut().poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
