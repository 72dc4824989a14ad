//! A minimal HTTP/1.1 client on `std::net`: one request, one whole response, every step
//! bounded in time and the response in size (the cluster's `submit`, `list` and `cancel`, and
//! the scheduler's scrapes of each job's metrics).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The largest response read (bytes).
const MAX_RESPONSE: u64 = 16 << 20;

/// A response: its status code and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, as text.
    pub body: String,
}

/// Why a request failed, and whether the server may have received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// One line naming the address and the step that failed ("timed out after N s" when the
    /// server did not answer in time).
    pub message: String,
    /// `false` when no byte of the request left this process (no address, no connection): the
    /// server cannot have acted on it. `true` when it failed while sending or reading the answer.
    pub maybe_received: bool,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RequestError {}

/// Sends one request to `addr` (`host:port`) with `headers` (name, value) and reads the whole
/// response; `timeout` bounds connecting, and each read and write. The error names the address
/// and says whether the server may have received the request.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> Result<Response, RequestError> {
    let fail = |what: &str, maybe_received: bool, e: std::io::Error| {
        let message = if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            format!(
                "{addr}: {what}: timed out after {} s",
                timeout.as_secs_f64()
            )
        } else {
            format!("{addr}: {what}: {e}")
        };
        RequestError {
            message,
            maybe_received,
        }
    };
    let target = addr
        .to_socket_addrs()
        .map_err(|e| fail("not an address (give HOST:PORT)", false, e))?
        .next()
        .ok_or_else(|| RequestError {
            message: format!("{addr}: the name has no address"),
            maybe_received: false,
        })?;
    let mut stream = TcpStream::connect_timeout(&target, timeout)
        .map_err(|e| fail("cannot connect", false, e))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| fail("socket", false, e))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| fail("socket", false, e))?;
    let body = body.unwrap_or("");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .map_err(|e| fail("cannot send the request", true, e))?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE)
        .read_to_end(&mut raw)
        .map_err(|e| fail("cannot read the response", true, e))?;
    parse_response(&raw).ok_or_else(|| RequestError {
        message: format!("{addr}: the answer is not an HTTP response"),
        maybe_received: true,
    })
}

/// Splits a whole HTTP/1.x response into status and body (chunked bodies decoded).
fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let mut parts = status_line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status: u16 = parts.next()?.parse().ok()?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = raw[end + 4..].to_vec();
    if chunked {
        body = dechunk(&body)?;
    }
    Some(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Decodes a chunked body.
fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_and_chunked_bodies_are_read() {
        let r = parse_response(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((r.status, r.body.as_str()), (201, "{}"));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, "abcde");
        assert_eq!(parse_response(b"SSH-2.0\r\n\r\n"), None);
    }
}
