//! Futex wait and wake on a word that may live in memory shared with other
//! processes (shared futexes: no `FUTEX_PRIVATE_FLAG`).

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, for at most `timeout`.  Returns on
/// a wake, a signal, the timeout, or at once when the word differs: callers
/// re-check their condition in a loop.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT only reads the word, which the borrow keeps alive
    // for the call, and the timespec on our stack.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes every waiter of `word`.
pub fn wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE touches no memory; the address only names the queue.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    #[test]
    fn a_wait_ends_on_wake_timeout_or_a_changed_word() {
        static W: AtomicU32 = AtomicU32::new(0);
        let t = Instant::now();
        wait(&W, 1, Duration::from_secs(5));
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "word differs: no sleep"
        );
        let t = Instant::now();
        wait(&W, 0, Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(25), "timeout");
        let waker = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            W.store(1, Ordering::Release);
            wake(&W);
        });
        let t = Instant::now();
        while W.load(Ordering::Acquire) == 0 {
            wait(&W, 0, Duration::from_secs(5));
        }
        assert!(t.elapsed() < Duration::from_secs(4), "woken");
        waker.join().unwrap();
    }
}
