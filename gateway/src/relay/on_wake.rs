//! Work polled only when it woke itself.
//!
//! `tokio::select!` polls every branch on every wake-up of its task. The
//! splice's task wakes for each burst of frames, and its other branches
//! (the idle and deadline timers, the kill signal) are almost never ready:
//! polling them costs a clock read, a timer-entry check and the locks of a
//! `Notify` and a cancellation token per wake-up. A [`WakeFlag`] gives that
//! work a waker of its own, and between two of that waker's wake-ups it
//! answers `Pending` without running it; [`OnWake`] is one over a future.
//!
//! Each flag registers the task's waker and reads its flag at every poll
//! of the task: the splice's watchdog (its timer and kill) and the
//! session's meter each have one. (The pump's legs had read flags too, so
//! that a frame on one leg did not poll the other leg's empty socket;
//! measured on voice calls, reading both legs at every wake-up, as a
//! byte-copying relay does, cost less CPU time than the flags' wakers did,
//! and with them went the registration those flags shared.)
//!
//! No wake-up is lost: the task's waker is registered before the flag is
//! read, so a wake-up that comes after the read wakes the task again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// A waker of its own for work polled beside a task's main work:
/// [`Self::poll`] runs that work only after this waker woke (and once at
/// first). [`OnWake`] is one over a future; the splice's watchdog is one
/// over its timer and kill, polled with the pump at hand.
pub struct WakeFlag {
    flag: Arc<Flag>,
    /// A waker that sets `flag` and wakes the task: given to the work.
    waker: Waker,
}

struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Default for WakeFlag {
    fn default() -> Self {
        Self::new()
    }
}

impl WakeFlag {
    pub fn new() -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(flag.clone());
        Self { flag, waker }
    }

    /// `work` with this flag's waker, if that woke since the last call
    /// (or this is the first); else `Pending`. Either way the task's waker
    /// (`cx`'s) is what this flag's waker wakes.
    pub fn poll<T>(
        &self,
        cx: &mut Context<'_>,
        work: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.flag.task.register(cx.waker());
        if !self.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        work(&mut Context::from_waker(&self.waker))
    }
}

/// Polls `F` only after `F` woke (and once at first).
pub struct OnWake<'a, F: ?Sized> {
    fut: Pin<&'a mut F>,
    flag: WakeFlag,
}

impl<'a, F: Future + ?Sized> OnWake<'a, F> {
    pub fn new(fut: Pin<&'a mut F>) -> Self {
        Self {
            fut,
            flag: WakeFlag::new(),
        }
    }
}

impl<F: Future + ?Sized> Future for OnWake<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let fut = &mut this.fut;
        this.flag.poll(cx, |cx| fut.as_mut().poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Pending until `ready`; counts its polls and keeps the last waker.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    fn probe_future(p: &Probe) -> impl Future<Output = u8> + '_ {
        std::future::poll_fn(move |cx| {
            p.polls.fetch_add(1, Ordering::SeqCst);
            if p.ready.load(Ordering::SeqCst) {
                return Poll::Ready(7);
            }
            *p.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    #[test]
    fn polls_the_future_only_after_it_woke_and_wakes_the_task() {
        let probe = Probe::default();
        let fut = std::pin::pin!(probe_future(&probe));
        let mut on_wake = OnWake::new(fut);
        let task = Arc::new(Count::default());
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert!(Pin::new(&mut on_wake).poll(&mut cx).is_pending());
        assert_eq!(
            probe.polls.load(Ordering::SeqCst),
            1,
            "polled once at first"
        );
        for _ in 0..5 {
            assert!(Pin::new(&mut on_wake).poll(&mut cx).is_pending());
        }
        assert_eq!(
            probe.polls.load(Ordering::SeqCst),
            1,
            "not polled before it woke"
        );
        assert_eq!(task.0.load(Ordering::SeqCst), 0);

        probe.ready.store(true, Ordering::SeqCst);
        let inner = probe.waker.lock().unwrap().take().unwrap();
        inner.wake();
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "its wake-up wakes the task"
        );
        assert_eq!(Pin::new(&mut on_wake).poll(&mut cx), Poll::Ready(7));
        assert_eq!(probe.polls.load(Ordering::SeqCst), 2);
    }

    /// Two in one task: each wakes the task and is told apart from the
    /// other.
    #[test]
    fn two_in_one_task_each_wake_it_and_stay_apart() {
        let task = Arc::new(Count::default());
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let (a, b) = (Probe::default(), Probe::default());
        let (fa, fb) = (
            std::pin::pin!(probe_future(&a)),
            std::pin::pin!(probe_future(&b)),
        );
        let mut wa = OnWake::new(fa);
        let mut wb = OnWake::new(fb);

        assert!(
            Pin::new(&mut wa).poll(&mut cx).is_pending()
                && Pin::new(&mut wb).poll(&mut cx).is_pending()
        );
        assert_eq!(
            (
                a.polls.load(Ordering::SeqCst),
                b.polls.load(Ordering::SeqCst)
            ),
            (1, 1),
            "each polled at first"
        );
        b.ready.store(true, Ordering::SeqCst);
        b.waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "b's wake-up wakes the task"
        );
        assert!(Pin::new(&mut wa).poll(&mut cx).is_pending());
        assert_eq!(a.polls.load(Ordering::SeqCst), 1, "a did not wake");
        assert_eq!(Pin::new(&mut wb).poll(&mut cx), Poll::Ready(7));
    }

    #[tokio::test]
    async fn a_timer_behind_it_fires_beside_a_busy_branch() {
        use std::time::Duration;
        let timer = std::pin::pin!(tokio::time::sleep(Duration::from_millis(50)));
        let mut watched = OnWake::new(timer);
        let start = tokio::time::Instant::now();
        // The other branch wakes the task every 2 ms, so the task is polled
        // often for reasons other than the timer; the timer must still be
        // seen when it fires (a lost wake-up would leave this loop running).
        let run = async {
            let mut ticks = 0u32;
            loop {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(Duration::from_millis(2)) => ticks += 1,
                    _ = &mut watched => return ticks,
                }
            }
        };
        let ticks = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("the timer's wake-up was lost");
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert!(ticks > 0, "the busy branch ran meanwhile");
    }
}
