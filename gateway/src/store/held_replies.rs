//! A test proxy to Redis that holds its replies: a command reaches Redis
//! (and runs) while its caller still waits, so a test can abandon or race
//! the caller at that moment.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// Forwards requests at once; from the first request naming `EVAL` (or
/// `EVALSHA`) on, holds the replies until [`HeldReplies::release`].
/// Replies before it (the connection's own setup) pass. One connection.
pub struct HeldReplies {
    addr: SocketAddr,
    replied: Arc<Notify>,
    release: Arc<Notify>,
}

impl HeldReplies {
    /// A proxy to the Redis of `url` (`redis://host:port[/db]`).
    pub async fn start(url: &str) -> Self {
        let host_port = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .expect("a host:port");
        let upstream = tokio::net::lookup_host(host_port)
            .await
            .expect("Redis's address resolves")
            .next()
            .expect("an address");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let (replied, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        tokio::spawn(serve(listener, upstream, replied.clone(), release.clone()));
        Self {
            addr,
            replied,
            release,
        }
    }

    /// The URL to connect to instead of Redis's.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Resolves once a reply is held: the script has run in Redis.
    pub async fn replied(&self) {
        self.replied.notified().await;
    }

    /// Lets the held replies, and every later one, through.
    pub fn release(&self) {
        self.release.notify_one();
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    upstream: SocketAddr,
    replied: Arc<Notify>,
    release: Arc<Notify>,
) -> std::io::Result<()> {
    let (client, _) = listener.accept().await?;
    let server = tokio::net::TcpStream::connect(upstream).await?;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let eval_sent = Arc::new(AtomicBool::new(false));
    let seen = eval_sent.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                return sw.shutdown().await;
            }
            // Marked before it is forwarded: its reply cannot come first.
            if buf[..n].windows(4).any(|w| w == b"EVAL") {
                seen.store(true, Ordering::SeqCst);
            }
            sw.write_all(&buf[..n]).await?;
        }
    });
    let mut buf = vec![0u8; 4096];
    let mut held = false;
    loop {
        let n = sr.read(&mut buf).await?;
        if n == 0 {
            return cw.shutdown().await;
        }
        if !held && eval_sent.load(Ordering::SeqCst) {
            held = true;
            replied.notify_one();
            release.notified().await;
        }
        cw.write_all(&buf[..n]).await?;
    }
}
