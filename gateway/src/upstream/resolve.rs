//! Where an upstream's host is, for each dial.
//!
//! An IP literal (`127.0.0.1`, `[::1]`) is parsed once, when the route is
//! built. A name (`api.openai.com`) is resolved by the system resolver
//! (`getaddrinfo`, on tokio's blocking pool), and the answer is kept for
//! [`TTL`]: without it every dial — each pool refill and each session on a
//! pool miss — paid a thread hand-off and, where no local cache answers, a
//! DNS round trip before its TCP handshake. `getaddrinfo` does not say how
//! long an answer may be kept, so [`TTL`] is short; and an answer none of
//! whose addresses accepts a connection, or whose address did not answer
//! before the dial gave up, is dropped at once, so a moved upstream is found
//! again on the next dial rather than after the TTL. The addresses are
//! tried in the resolver's order, the next one started beside an attempt
//! that has not answered within [`ATTEMPT_DELAY`] (RFC 8305's connection
//! attempts, without its address sorting): an address that drops packets,
//! such as an AAAA record on a host whose IPv6 goes nowhere, costs a
//! quarter of a second, not the dial's deadline.
//!
//! Clones share one cache (the pool and the sessions of a route dial the
//! same [`Resolver`]). Dials that find the cache stale at the same moment
//! share one resolution: the first resolves, the others wait for its
//! answer (a pool refilling hundreds of sockets at once would otherwise
//! start as many `getaddrinfo` calls, each a blocking-pool thread and a
//! DNS query per search domain).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long a resolved name's addresses are used before it is resolved
/// again.
pub const TTL: Duration = Duration::from_secs(30);
/// How long a connection attempt to one address goes unanswered before the
/// next address is tried beside it (RFC 8305 §5 recommends 250 ms).
pub const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// One upstream host and port, resolved as needed.
#[derive(Clone)]
pub struct Resolver {
    host: Arc<str>,
    port: u16,
    /// Set when the host is an IP address: nothing to resolve.
    literal: Option<SocketAddr>,
    ttl: Duration,
    cached: Arc<Mutex<Option<Cached>>>,
    /// Held by the one resolution in progress.
    resolving: Arc<tokio::sync::Mutex<()>>,
    /// Resolutions done, for tests and the log.
    lookups: Arc<AtomicU64>,
}

struct Cached {
    at: Instant,
    addrs: Arc<[SocketAddr]>,
}

/// Drops the cached answer when dropped armed: a connect that failed on
/// every address, or was given up on.
struct ForgetOnDrop<'a> {
    resolver: &'a Resolver,
    armed: bool,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.resolver.forget();
        }
    }
}

impl Resolver {
    /// `host` as a URL gives it: an IPv6 literal in brackets or bare.
    pub fn new(host: &str, port: u16) -> Self {
        Self::with_ttl(host, port, TTL)
    }

    /// [`Resolver::new`] keeping answers for `ttl`.
    pub fn with_ttl(host: &str, port: u16, ttl: Duration) -> Self {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Self {
            host: host.into(),
            port,
            literal: bare
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, port)),
            ttl,
            cached: Arc::default(),
            resolving: Arc::default(),
            lookups: Arc::default(),
        }
    }

    /// Connects to the host's addresses in the resolver's order, the
    /// next one started when the last failed or [`ATTEMPT_DELAY`] passed
    /// without an answer, the attempts racing (RFC 8305's connection
    /// attempts): the first that accepts wins, the others are dropped. When
    /// none accepts, or the caller gives up first (a dial's deadline passed
    /// while no address answered), the cached answer is dropped.
    pub async fn connect(&self) -> io::Result<TcpStream> {
        if let Some(addr) = self.literal {
            return TcpStream::connect(addr).await;
        }
        let addrs = self.addrs().await?;
        let mut unanswered = ForgetOnDrop {
            resolver: self,
            armed: true,
        };
        let mut next = addrs.iter().copied();
        let mut attempts = FuturesUnordered::new();
        let mut last = None;
        loop {
            if attempts.is_empty() {
                match next.next() {
                    Some(addr) => attempts.push(TcpStream::connect(addr)),
                    None => break,
                }
            }
            let more = next.len() > 0;
            tokio::select! {
                biased;
                Some(done) = attempts.next() => match done {
                    Ok(tcp) => {
                        unanswered.armed = false;
                        return Ok(tcp);
                    }
                    Err(e) => last = Some(e),
                },
                () = tokio::time::sleep(ATTEMPT_DELAY), if more => {
                    if let Some(addr) = next.next() {
                        attempts.push(TcpStream::connect(addr));
                    }
                }
                else => break,
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("the upstream host has no address")))
    }

    /// The host's addresses: cached within the TTL, resolved otherwise.
    pub async fn addrs(&self) -> io::Result<Arc<[SocketAddr]>> {
        if let Some(addr) = self.literal {
            return Ok(Arc::from([addr]));
        }
        if let Some(addrs) = self.fresh() {
            return Ok(addrs);
        }
        let _resolving = self.resolving.lock().await;
        // Resolved while this dial waited: that answer is this dial's too.
        if let Some(addrs) = self.fresh() {
            return Ok(addrs);
        }
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let addrs: Arc<[SocketAddr]> = tokio::net::lookup_host((&*self.host, self.port))
            .await?
            .collect();
        if addrs.is_empty() {
            return Err(io::Error::other(format!(
                "{} resolved to no address",
                self.host
            )));
        }
        *self.slot() = Some(Cached {
            at: Instant::now(),
            addrs: addrs.clone(),
        });
        Ok(addrs)
    }

    /// How many times the name was resolved (an IP literal: never).
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// `host:port`, for errors.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn fresh(&self) -> Option<Arc<[SocketAddr]>> {
        let slot = self.slot();
        let cached = slot.as_ref()?;
        (cached.at.elapsed() < self.ttl).then(|| cached.addrs.clone())
    }

    fn forget(&self) {
        *self.slot() = None;
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Cached>> {
        // The slot holds no invariant a panic could break.
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_ip_literal_is_never_resolved() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let r = Resolver::new("127.0.0.1", port);
        r.connect().await.expect("connects");
        r.connect().await.expect("connects again");
        assert_eq!(r.lookups(), 0);
        let v6 = Resolver::new("[::1]", 443);
        assert_eq!(&*v6.addrs().await.unwrap(), &["[::1]:443".parse().unwrap()]);
        assert_eq!(v6.lookups(), 0);
    }

    #[tokio::test]
    async fn a_name_is_resolved_once_per_ttl_and_clones_share_the_answer() {
        let r = Resolver::new("localhost", 9);
        let first = r.addrs().await.expect("localhost resolves");
        assert!(first.iter().all(|a| a.ip().is_loopback() && a.port() == 9));
        let clone = r.clone();
        assert_eq!(clone.addrs().await.unwrap(), first);
        assert_eq!(r.lookups(), 1, "the second ask came from the cache");

        let expired = Resolver::with_ttl("localhost", 9, Duration::ZERO);
        expired.addrs().await.unwrap();
        expired.addrs().await.unwrap();
        assert_eq!(expired.lookups(), 2, "past its TTL an answer is not used");
    }

    #[tokio::test]
    async fn dials_that_find_no_answer_at_once_share_one_resolution() {
        let r = Resolver::new("localhost", 9);
        let asks: Vec<_> = (0..64)
            .map(|_| {
                let r = r.clone();
                tokio::spawn(async move { r.addrs().await })
            })
            .collect();
        for ask in asks {
            assert!(ask.await.unwrap().is_ok());
        }
        assert_eq!(r.lookups(), 1);
    }

    #[tokio::test]
    async fn a_working_answer_is_reused_and_one_no_address_accepts_is_dropped() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let r = Resolver::new("localhost", port);
        r.connect().await.expect("connects through localhost");
        r.connect().await.expect("connects again");
        assert_eq!(r.lookups(), 1, "a working answer is reused");
        drop(listener);
        assert!(r.connect().await.is_err(), "nothing listens any more");
        assert_eq!(r.lookups(), 1, "the cached answer was tried");
        assert!(r.connect().await.is_err());
        assert_eq!(r.lookups(), 2, "the failed answer was dropped");
    }

    /// A listener whose accept queue is full drops the next SYN: a connect
    /// to it hangs, as to a blackholed address, on loopback. Returns it
    /// with the connections that fill its queue.
    async fn blackhole() -> (tokio::net::TcpListener, Vec<TcpStream>) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        loop {
            let attempt =
                tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr));
            match attempt.await {
                Ok(Ok(s)) => held.push(s),
                Ok(Err(e)) => panic!("connect: {e}"),
                Err(_) => return (listener, held),
            }
            assert!(held.len() < 64, "the accept queue never filled");
        }
    }

    #[tokio::test]
    async fn an_address_that_does_not_answer_does_not_hold_up_the_next() {
        let (dead, held) = blackhole().await;
        let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Resolver::new("example.invalid", 443);
        *r.slot() = Some(Cached {
            at: Instant::now(),
            addrs: Arc::from([dead.local_addr().unwrap(), live.local_addr().unwrap()]),
        });
        let tcp = tokio::time::timeout(Duration::from_secs(5), r.connect())
            .await
            .expect("the second address is tried beside the first")
            .expect("connected");
        assert_eq!(tcp.peer_addr().unwrap(), live.local_addr().unwrap());
        assert_eq!(r.lookups(), 0, "the seeded answer was used");
        assert!(r.fresh().is_some(), "a working answer is kept");
        drop((held, dead));
    }

    #[tokio::test]
    async fn an_answer_given_up_on_mid_connect_is_dropped() {
        let (listener, held) = blackhole().await;
        let addr = listener.local_addr().unwrap();
        let r = Resolver::new("localhost", addr.port());
        let cut = tokio::time::timeout(Duration::from_millis(300), r.connect()).await;
        assert!(cut.is_err(), "the connect was given up on: {cut:?}");
        assert_eq!(r.lookups(), 1);
        r.addrs().await.unwrap();
        assert_eq!(r.lookups(), 2, "the answer given up on was dropped");
        drop((held, listener));
    }
}
