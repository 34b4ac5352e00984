//! The watcher thread's bell (`watcher.rs`): how this handle tells the
//! thread to look for a local reason (a commit that wrote a watched key, a
//! new registration) or to stop (`close`). On Linux an eventfd, which the
//! thread's one `ppoll` waits on with its other sources (`sources.rs`);
//! elsewhere a condition variable, which it waits on alone.

/// The watcher's doorbell for this handle's own reasons to look. Level
/// triggered: a ring that comes between the watcher's check of its flags
/// and its wait makes the wait return at once, so none is lost.
pub(crate) struct Bell {
    #[cfg(target_os = "linux")]
    fd: std::os::fd::OwnedFd,
    #[cfg(not(target_os = "linux"))]
    rung: (std::sync::Mutex<bool>, std::sync::Condvar),
    /// Tests only: the next wait treats its sources as failed.
    #[cfg(feature = "testkit")]
    sources_fault: std::sync::atomic::AtomicBool,
}

impl Bell {
    pub(crate) fn new() -> std::io::Result<Bell> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: a plain syscall with constant flags.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            let fd = owned(fd).ok_or_else(std::io::Error::last_os_error)?;
            Ok(Bell {
                fd,
                #[cfg(feature = "testkit")]
                sources_fault: Default::default(),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(Bell {
                rung: Default::default(),
                #[cfg(feature = "testkit")]
                sources_fault: Default::default(),
            })
        }
    }

    /// Tests only: makes the watcher's wait (woken by this ring) find its
    /// sources failed, as a failing `recv` of the wake socket or read of
    /// inotify would.
    #[cfg(feature = "testkit")]
    pub(crate) fn fail_sources(&self) {
        self.sources_fault.store(true, std::sync::atomic::Ordering::SeqCst);
        self.ring();
    }

    /// Tests only: [`Bell::fail_sources`] not yet taken by a wait.
    #[cfg(feature = "testkit")]
    pub(crate) fn sources_failure_pending(&self) -> bool {
        self.sources_fault.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether a wait must treat its sources as failed (tests only).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn take_sources_fault(&self) -> bool {
        #[cfg(feature = "testkit")]
        {
            self.sources_fault.swap(false, std::sync::atomic::Ordering::SeqCst)
        }
        #[cfg(not(feature = "testkit"))]
        {
            false
        }
    }

    /// The eventfd, for the watcher's `ppoll` (`sources.rs`).
    #[cfg(target_os = "linux")]
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Takes the rings so far (after the poll found the bell rung).
    #[cfg(target_os = "linux")]
    pub(crate) fn drain(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from an eventfd we own
        // (non-blocking: EAGAIN when not rung).
        let _ = unsafe { libc::read(self.fd(), (&mut count as *mut u64).cast(), 8) };
    }

    /// Waits until rung or `deadline` (`None`: none), and takes the ring:
    /// off Linux the bell is all the watcher waits on.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn wait(&self, deadline: Option<std::time::Instant>) {
        let (lock, cvar) = &self.rung;
        let mut rung = lock.lock().unwrap_or_else(|p| p.into_inner());
        while !*rung {
            match deadline {
                None => rung = cvar.wait(rung).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    rung = cvar.wait_timeout(rung, left).unwrap_or_else(|p| p.into_inner()).0;
                }
            }
        }
        *rung = false;
    }

    /// Wakes the watcher (or makes its next wait return at once).
    pub(crate) fn ring(&self) {
        #[cfg(target_os = "linux")]
        {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
            // It fails only when the counter is near u64::MAX: rung anyway.
            let _ = unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
        }
        #[cfg(not(target_os = "linux"))]
        {
            let mut rung = self.rung.0.lock().unwrap_or_else(|p| p.into_inner());
            *rung = true;
            self.rung.1.notify_one();
        }
    }
}

/// Owns a descriptor just returned by the kernel (`None`: the call failed).
#[cfg(target_os = "linux")]
pub(crate) fn owned(fd: libc::c_int) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a descriptor just returned by the kernel, owned by nobody else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}
