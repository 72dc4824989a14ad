//! One HTTP/1.x request head, read under a size cap, and the response to it.
//!
//! Only what a metrics endpoint needs: the request line and the `Accept` header. A head
//! that passes the caps is answered `414` (request line) or `431` (headers) without
//! reading further; a malformed one is answered `400`; every response closes the
//! connection.

use crate::registry::TrainingMetrics;

use super::{OPENMETRICS_TEXT, PROMETHEUS_TEXT};

/// What the bytes received so far amount to.
#[derive(Debug, PartialEq)]
pub(crate) enum Parsed {
    /// The head has not ended yet and is within the caps.
    Incomplete,
    /// A complete, well-formed head.
    Request(Request),
    /// A head that cannot be served: answer with this status and close.
    Reject(Status),
}

/// The parts of a request the endpoint looks at.
#[derive(Debug, PartialEq)]
pub(crate) struct Request {
    /// `HEAD` (no body in the answer) rather than `GET`.
    pub head_only: bool,
    /// The method was GET or HEAD.
    pub allowed: bool,
    /// The path, without the query.
    pub path: String,
    /// The `Accept` header, if any.
    pub accept: Option<String>,
}

/// The statuses this endpoint answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    UriTooLong,
    HeadersTooLarge,
    VersionNotSupported,
}

impl Status {
    fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::BadRequest => "400 Bad Request",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::UriTooLong => "414 URI Too Long",
            Status::HeadersTooLarge => "431 Request Header Fields Too Large",
            Status::VersionNotSupported => "505 HTTP Version Not Supported",
        }
    }
}

/// Reads the head in `buf` (all bytes received so far), with the request line capped at
/// `max_line` bytes and the whole head at `max_head` bytes.
pub(crate) fn parse(buf: &[u8], max_line: usize, max_head: usize) -> Parsed {
    let Some(line_end) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > max_line {
            Parsed::Reject(Status::UriTooLong)
        } else {
            Parsed::Incomplete
        };
    };
    if line_end > max_line {
        return Parsed::Reject(Status::UriTooLong);
    }
    let Some(head_len) = head_end(buf) else {
        return if buf.len() > max_head {
            Parsed::Reject(Status::HeadersTooLarge)
        } else {
            Parsed::Incomplete
        };
    };
    if head_len > max_head {
        return Parsed::Reject(Status::HeadersTooLarge);
    }
    match request(&buf[..head_len]) {
        Ok(request) => Parsed::Request(request),
        Err(status) => Parsed::Reject(status),
    }
}

/// The length of the head (through its empty line), if it has ended. Lines may end in
/// CRLF or a bare LF.
fn head_end(buf: &[u8]) -> Option<usize> {
    // Empty lines before the request line are skipped (RFC 9112 2.2).
    let (mut start, mut seen_line) = (0, false);
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let line = &buf[start..i];
            let empty = line.is_empty() || line == b"\r";
            if empty && seen_line {
                return Some(i + 1);
            }
            seen_line |= !empty;
            start = i + 1;
        }
    }
    None
}

fn request(head: &[u8]) -> Result<Request, Status> {
    let text = std::str::from_utf8(head).map_err(|_| Status::BadRequest)?;
    let mut lines = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .skip_while(|l| l.is_empty());
    let request_line = lines.next().ok_or(Status::BadRequest)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Status::BadRequest);
    };
    if method.is_empty() || target.is_empty() || method.bytes().any(|b| b.is_ascii_control()) {
        return Err(Status::BadRequest);
    }
    match version.strip_prefix("HTTP/") {
        Some("1.0" | "1.1") => {}
        Some(_) => return Err(Status::VersionNotSupported),
        None => return Err(Status::BadRequest),
    }
    let path = origin_path(target).ok_or(Status::BadRequest)?;
    let mut accept = None;
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(Status::BadRequest)?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(Status::BadRequest);
        }
        if name.eq_ignore_ascii_case("accept") {
            accept = Some(value.trim().to_string());
        }
    }
    Ok(Request {
        head_only: method == "HEAD",
        allowed: method == "GET" || method == "HEAD",
        path: path.to_string(),
        accept,
    })
}

/// The path of a request target in origin form (`/p?q`) or absolute form
/// (`http://host/p?q`), without the query; `None` for anything else (`*`, `host:port`) or a
/// path with control characters.
fn origin_path(target: &str) -> Option<&str> {
    let rest = match target.find("://") {
        Some(scheme_end) if !target[..scheme_end].contains('/') => {
            let after = &target[scheme_end + 3..];
            after.find('/').map_or("/", |slash| &after[slash..])
        }
        _ => target,
    };
    let path = rest.split(['?', '#']).next()?;
    (path.starts_with('/') && !path.bytes().any(|b| b.is_ascii_control())).then_some(path)
}

/// The whole response (head and, unless `HEAD`, body) to `request`.
pub(crate) fn respond(request: &Request, metrics: &TrainingMetrics) -> Vec<u8> {
    if !request.allowed {
        return response(
            Status::MethodNotAllowed,
            TEXT,
            b"only GET /metrics\n",
            false,
        );
    }
    let (status, content_type, body) = match request.path.as_str() {
        "/metrics" => {
            if super::wants_openmetrics(request.accept.as_deref()) {
                (Status::Ok, OPENMETRICS_TEXT, metrics.openmetrics())
            } else {
                (Status::Ok, PROMETHEUS_TEXT, metrics.prometheus_text())
            }
        }
        "/" => (Status::Ok, TEXT, "dualpipe: metrics at /metrics\n".into()),
        _ => (
            Status::NotFound,
            TEXT,
            "not found; metrics at /metrics\n".into(),
        ),
    };
    response(status, content_type, body.as_bytes(), request.head_only)
}

/// The response to a request that is not served: `status` with a one-line reason.
pub(crate) fn reject(status: Status) -> Vec<u8> {
    let body = match status {
        Status::UriTooLong => "the request line is too long\n",
        Status::HeadersTooLarge => "the request headers are too large\n",
        Status::VersionNotSupported => "only HTTP/1.0 and HTTP/1.1\n",
        _ => "a malformed request; GET /metrics\n",
    };
    response(status, TEXT, body.as_bytes(), false)
}

const TEXT: &str = "text/plain; charset=utf-8";

fn response(status: Status, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let allow = if status == Status::MethodNotAllowed {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}\
         Connection: close\r\n\r\n",
        status.line(),
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, accept: Option<&str>) -> Parsed {
        Parsed::Request(Request {
            head_only: false,
            allowed: true,
            path: path.into(),
            accept: accept.map(Into::into),
        })
    }

    #[test]
    fn a_plain_scrape_and_its_variants() {
        let p = |b: &[u8]| parse(b, 1024, 4096);
        assert_eq!(
            p(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            get("/metrics", None)
        );
        assert_eq!(
            p(b"GET /metrics HTTP/1.1\nHost: x\n\n"),
            get("/metrics", None)
        );
        assert_eq!(p(b"GET /metrics HTTP/1.0\r\n\r\n"), get("/metrics", None));
        assert_eq!(
            p(b"GET /metrics?x=1 HTTP/1.1\r\naCcEpT: text/plain \r\n\r\n"),
            get("/metrics", Some("text/plain"))
        );
        assert_eq!(
            p(b"GET http://h:1/metrics HTTP/1.1\r\n\r\n"),
            get("/metrics", None)
        );
        assert_eq!(p(b"\r\nGET / HTTP/1.1\r\n\r\n"), get("/", None));
        let Parsed::Request(head) = p(b"HEAD /metrics HTTP/1.1\r\n\r\n") else {
            panic!()
        };
        assert!(head.head_only && head.allowed);
        let Parsed::Request(post) = p(b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        else {
            panic!()
        };
        assert!(!post.allowed);
    }

    #[test]
    fn an_unfinished_head_waits_and_a_bad_one_is_rejected() {
        let p = |b: &[u8]| parse(b, 1024, 4096);
        assert_eq!(
            p(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
            Parsed::Incomplete
        );
        assert_eq!(p(b"GET /met"), Parsed::Incomplete);
        for bad in [
            &b"GARBAGE\r\n\r\n"[..],
            b"GET /metrics\r\n\r\n",
            b"GET /met\x00rics HTTP/1.1\r\n\r\n",
            b"GET /\xff\xfe HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\n\r\n",
            b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(p(bad), Parsed::Reject(Status::BadRequest), "{bad:?}");
        }
        assert_eq!(
            p(b"GET /metrics HTTP/9.9\r\n\r\n"),
            Parsed::Reject(Status::VersionNotSupported)
        );
    }

    #[test]
    fn the_caps_cut_a_long_line_and_endless_headers() {
        let long_line = [b"GET /".as_slice(), &[b'a'; 2000]].concat();
        assert_eq!(
            parse(&long_line, 1024, 4096),
            Parsed::Reject(Status::UriTooLong)
        );
        let mut endless = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
        endless.extend(std::iter::repeat_n(b'a', 4000));
        assert_eq!(parse(&endless, 1024, 4096), Parsed::Incomplete);
        endless.extend(std::iter::repeat_n(b'a', 200));
        assert_eq!(
            parse(&endless, 1024, 4096),
            Parsed::Reject(Status::HeadersTooLarge)
        );
    }

    #[test]
    fn responses_close_and_head_has_no_body() {
        let metrics = TrainingMetrics::new(1);
        let req = |path: &str, head_only| Request {
            head_only,
            allowed: true,
            path: path.into(),
            accept: None,
        };
        let full = String::from_utf8(respond(&req("/metrics", false), &metrics)).unwrap();
        assert!(full.starts_with("HTTP/1.1 200 OK\r\n"), "{full}");
        assert!(full.contains("Connection: close\r\n"));
        let (head, body) = full.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let head_only = String::from_utf8(respond(&req("/metrics", true), &metrics)).unwrap();
        assert!(head_only.ends_with("\r\n\r\n"));
        assert!(String::from_utf8(respond(&req("/x", false), &metrics))
            .unwrap()
            .starts_with("HTTP/1.1 404"));
        assert!(String::from_utf8(reject(Status::HeadersTooLarge))
            .unwrap()
            .starts_with("HTTP/1.1 431"));
    }
}
