//! DNS clients the loopback tests share: UDP and TCP clients of a server on
//! this machine's loopback, and one query.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use hickory_net::client::{Client, ClientHandle};
use hickory_net::proto::op::DnsResponse;
use hickory_net::proto::rr::{DNSClass, Name, RecordType};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::tcp::TcpClientStream;
use hickory_net::udp::UdpClientStream;

pub const TIMEOUT: Duration = Duration::from_secs(5);

pub fn udp_client(server: SocketAddr) -> Client<TokioRuntimeProvider> {
    let stream = UdpClientStream::builder(server, TokioRuntimeProvider::default())
        .with_timeout(Some(TIMEOUT))
        .build();
    let (client, background) = Client::<TokioRuntimeProvider>::from_sender(stream);
    tokio::spawn(background);
    client
}

pub async fn tcp_client(server: SocketAddr) -> Client<TokioRuntimeProvider> {
    let (connect, sender) =
        TcpClientStream::new(server, None, Some(TIMEOUT), TokioRuntimeProvider::default());
    let (client, background) =
        Client::<TokioRuntimeProvider>::with_timeout(connect.await.unwrap(), sender, TIMEOUT);
    tokio::spawn(background);
    client
}

pub async fn query(
    client: &mut Client<TokioRuntimeProvider>,
    name: &str,
    qtype: RecordType,
) -> DnsResponse {
    client
        .query(Name::from_str(name).unwrap(), DNSClass::IN, qtype)
        .await
        .unwrap()
}
