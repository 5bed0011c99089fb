//! Per-link TCP proxies for partitions. Every directed peer link i→j (node
//! i dialling node j's Raft endpoint) gets its own loopback listener that
//! forwards to j; blocking the link refuses new connections (accepted, then
//! closed at once) and cuts the ones open, so i's RPCs to j fail while j's
//! RPCs to i (link j→i) are unaffected. Healing lets connections through
//! again. The proxies know nothing of Raft; nodes are pointed at them with
//! `--peer-via`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One directed link's proxy; dropping it stops it and cuts its connections.
pub struct LinkProxy {
    listen_addr: SocketAddr,
    blocked: watch::Sender<bool>,
    accept_task: JoinHandle<()>,
}

impl LinkProxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `target`, passing traffic until blocked.
    pub async fn start(target: SocketAddr) -> anyhow::Result<LinkProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a proxy listener")?;
        let listen_addr = listener.local_addr()?;
        let (blocked, blocked_rx) = watch::channel(false);
        let accept_task = tokio::spawn(accept_loop(listener, target, blocked_rx));
        Ok(LinkProxy {
            listen_addr,
            blocked,
            accept_task,
        })
    }

    /// The address to dial instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// Refuses new connections and cuts the open ones (true) or passes
    /// traffic again (false).
    pub fn set_blocked(&self, blocked: bool) {
        self.blocked.send_replace(blocked);
    }

    pub fn is_blocked(&self) -> bool {
        *self.blocked.borrow()
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        // Cut the forwarding tasks (they watch this) and stop accepting.
        self.blocked.send_replace(true);
        self.accept_task.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, blocked: watch::Receiver<bool>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if *blocked.borrow() {
            drop(inbound);
            continue;
        }
        let mut blocked = blocked.clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else {
                return;
            };
            let _ = outbound.set_nodelay(true);
            let _ = inbound.set_nodelay(true);
            let mut inbound = inbound;
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = blocked.wait_for(|blocked| *blocked) => {}
            }
            // Both sockets close here.
        });
    }
}

/// Every directed link between `nodes`, each with its proxy.
pub struct Proxies {
    links: BTreeMap<(u64, u64), LinkProxy>,
}

impl Proxies {
    /// A proxy for every ordered pair (from, to), from ≠ to, forwarding to
    /// `peer_addrs[to]`.
    pub async fn start(peer_addrs: &BTreeMap<u64, SocketAddr>) -> anyhow::Result<Proxies> {
        let mut links = BTreeMap::new();
        for &from in peer_addrs.keys() {
            for (&to, &target) in peer_addrs {
                if from != to {
                    links.insert((from, to), LinkProxy::start(target).await?);
                }
            }
        }
        Ok(Proxies { links })
    }

    /// The address node `from` must dial to reach node `to`.
    pub fn addr(&self, from: u64, to: u64) -> Option<SocketAddr> {
        self.links.get(&(from, to)).map(LinkProxy::addr)
    }

    /// Blocks the directed link from → to.
    pub fn block(&self, from: u64, to: u64) {
        if let Some(link) = self.links.get(&(from, to)) {
            link.set_blocked(true);
        }
    }

    /// Blocks both directions between `a` and `b`.
    pub fn cut(&self, a: u64, b: u64) {
        self.block(a, b);
        self.block(b, a);
    }

    /// Cuts `node` off from every other node.
    pub fn isolate(&self, node: u64) {
        let others: BTreeSet<u64> = self.links.keys().map(|(from, _)| *from).collect();
        for other in others {
            if other != node {
                self.cut(node, other);
            }
        }
    }

    /// Passes traffic on every link again.
    pub fn heal(&self) {
        for link in self.links.values() {
            link.set_blocked(false);
        }
    }

    /// The directed links now blocked.
    pub fn blocked(&self) -> Vec<(u64, u64)> {
        self.links
            .iter()
            .filter(|(_, link)| link.is_blocked())
            .map(|(pair, _)| *pair)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    loop {
                        match socket.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if socket.write_all(&buffer[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// Sends `bytes` and expects them echoed back within a second.
    async fn round_trip(socket: &mut TcpStream, bytes: &[u8]) -> bool {
        if socket.write_all(bytes).await.is_err() {
            return false;
        }
        let mut buffer = vec![0u8; bytes.len()];
        matches!(
            tokio::time::timeout(Duration::from_secs(1), socket.read_exact(&mut buffer)).await,
            Ok(Ok(_)) if buffer == bytes
        )
    }

    /// A passing link forwards; blocking cuts the open connection and
    /// refuses new ones; healing passes again.
    #[tokio::test]
    async fn pass_block_heal() {
        let target = echo().await;
        let proxy = LinkProxy::start(target).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut open, b"hello").await);

        proxy.set_blocked(true);
        assert!(
            !round_trip(&mut open, b"again").await,
            "open connection cut"
        );
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(
            !round_trip(&mut fresh, b"new").await,
            "new connection refused"
        );

        proxy.set_blocked(false);
        let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut healed, b"healed").await);
    }

    /// Blocking one direction leaves the other passing.
    #[tokio::test]
    async fn one_way_block() {
        let a = echo().await;
        let b = echo().await;
        let proxies = Proxies::start(&BTreeMap::from([(1, a), (2, b)]))
            .await
            .unwrap();
        proxies.block(1, 2);
        assert_eq!(proxies.blocked(), [(1, 2)]);
        let mut one_to_two = TcpStream::connect(proxies.addr(1, 2).unwrap())
            .await
            .unwrap();
        assert!(!round_trip(&mut one_to_two, b"x").await);
        let mut two_to_one = TcpStream::connect(proxies.addr(2, 1).unwrap())
            .await
            .unwrap();
        assert!(round_trip(&mut two_to_one, b"y").await);
        proxies.heal();
        assert!(proxies.blocked().is_empty());
        let mut again = TcpStream::connect(proxies.addr(1, 2).unwrap())
            .await
            .unwrap();
        assert!(round_trip(&mut again, b"z").await);
    }
}
