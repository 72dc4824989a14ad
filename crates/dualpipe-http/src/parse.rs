//! One HTTP/1.x request head, read under its caps: the request line (ASCII only), the
//! headers, and the body's length from `Content-Length`.
//!
//! A head past a cap is rejected (`414` request line, `431` headers) without reading
//! further; a malformed one is `400`; a `Content-Length` that is not a decimal number (a sign,
//! spaces inside, two that differ) is `400`, one past the body cap `413`; a chunked body is
//! refused with `411` (send a `Content-Length`).

/// What the bytes received so far amount to.
#[derive(Debug, PartialEq)]
pub(crate) enum Parsed {
    /// The head has not ended yet and is within the caps.
    Incomplete,
    /// A complete, well-formed head.
    Head(Head),
    /// A head that cannot be served: answer with this status and reason, and close.
    Reject(u16, &'static str),
}

/// A complete request head.
#[derive(Debug, PartialEq)]
pub(crate) struct Head {
    /// Bytes of the head, through its empty line.
    pub len: usize,
    /// The method.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query, if any.
    pub query: Option<String>,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body's length.
    pub body_len: usize,
}

/// Reads the head in `buf` (all bytes received so far), with the request line capped at
/// `max_line` bytes, the whole head at `max_head` bytes and the body at `max_body`.
pub(crate) fn parse(buf: &[u8], max_line: usize, max_head: usize, max_body: usize) -> Parsed {
    let Some(line_end) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > max_line {
            Parsed::Reject(414, "the request line is too long")
        } else {
            Parsed::Incomplete
        };
    };
    if line_end > max_line {
        return Parsed::Reject(414, "the request line is too long");
    }
    let Some(head_len) = head_end(buf) else {
        return if buf.len() > max_head {
            Parsed::Reject(431, "the request headers are too large")
        } else {
            Parsed::Incomplete
        };
    };
    if head_len > max_head {
        return Parsed::Reject(431, "the request headers are too large");
    }
    match head(&buf[..head_len], max_body) {
        Ok(mut h) => {
            h.len = head_len;
            Parsed::Head(h)
        }
        Err((status, why)) => Parsed::Reject(status, why),
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

type Bad = (u16, &'static str);

const BAD_LINE: Bad = (400, "a malformed request line");

fn head(bytes: &[u8], max_body: usize) -> Result<Head, Bad> {
    let mut lines = bytes
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .skip_while(|l| l.is_empty());
    let line = lines.next().ok_or(BAD_LINE)?;
    // The request line is ASCII (a target is percent-encoded): printable bytes and spaces.
    if !line.iter().all(|&b| b == b' ' || b.is_ascii_graphic()) {
        return Err((
            400,
            "a request line with bytes that are not printable ASCII",
        ));
    }
    let line = std::str::from_utf8(line).map_err(|_| BAD_LINE)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BAD_LINE);
    };
    if method.is_empty() || target.is_empty() {
        return Err(BAD_LINE);
    }
    match version.strip_prefix("HTTP/") {
        Some("1.0" | "1.1") => {}
        Some(_) => return Err((505, "only HTTP/1.0 and HTTP/1.1")),
        None => return Err(BAD_LINE),
    }
    let (path, query) = origin(target).ok_or(BAD_LINE)?;
    let mut headers = Vec::new();
    for raw in lines.take_while(|l| !l.is_empty()) {
        let text = std::str::from_utf8(raw).map_err(|_| (400, "a header that is not UTF-8"))?;
        let (name, value) = text
            .split_once(':')
            .ok_or((400, "a header line without a colon"))?;
        if name.is_empty()
            || !name.bytes().all(|b| b.is_ascii_graphic())
            || value.bytes().any(|b| b.is_ascii_control() && b != b'\t')
        {
            return Err((400, "a malformed header"));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let body_len = body_len(&headers, max_body)?;
    Ok(Head {
        len: 0,
        method: method.to_string(),
        path: path.to_string(),
        query: query.map(str::to_string),
        headers,
        body_len,
    })
}

/// The body's length from the headers: `Content-Length` (decimal digits only, every copy
/// equal), none without one; a chunked body is refused.
fn body_len(headers: &[(String, String)], max_body: usize) -> Result<usize, Bad> {
    if headers.iter().any(|(n, _)| n == "transfer-encoding") {
        return Err((
            411,
            "a body without a Content-Length (chunked bodies are not taken); send its Content-Length",
        ));
    }
    let mut length: Option<&str> = None;
    for (_, value) in headers.iter().filter(|(n, _)| n == "content-length") {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err((
                400,
                "a bad Content-Length: give the body's bytes as a decimal number",
            ));
        }
        if length.is_some_and(|l| l != value) {
            return Err((400, "a bad Content-Length: two that differ"));
        }
        length = Some(value);
    }
    let Some(length) = length else { return Ok(0) };
    let too_large = (413, "the body is larger than this server takes");
    let n: usize = length.parse().map_err(|_| too_large)?;
    if n > max_body {
        return Err(too_large);
    }
    Ok(n)
}

/// The path and query of a request target in origin form (`/p?q`) or absolute form
/// (`http://host/p?q`); `None` for anything else (`*`, `host:port`).
fn origin(target: &str) -> Option<(&str, Option<&str>)> {
    let rest = match target.find("://") {
        Some(scheme_end) if !target[..scheme_end].contains('/') => {
            let after = &target[scheme_end + 3..];
            after.find('/').map_or("/", |slash| &after[slash..])
        }
        _ => target,
    };
    let rest = rest.split('#').next()?;
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    path.starts_with('/').then_some((path, query))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(b: &[u8]) -> Parsed {
        parse(b, 1024, 4096, 100)
    }

    fn path_of(parsed: Parsed) -> (String, Option<String>, usize) {
        match parsed {
            Parsed::Head(h) => (h.path, h.query, h.body_len),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_plain_request_and_its_variants() {
        let want = |path: &str| (path.to_string(), None, 0);
        assert_eq!(
            path_of(p(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")),
            want("/metrics")
        );
        assert_eq!(
            path_of(p(b"GET /metrics HTTP/1.1\nHost: x\n\n")),
            want("/metrics")
        );
        assert_eq!(
            path_of(p(b"GET /metrics HTTP/1.0\r\n\r\n")),
            want("/metrics")
        );
        assert_eq!(
            path_of(p(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n")),
            ("/metrics".into(), Some("x=1".into()), 0)
        );
        assert_eq!(
            path_of(p(b"GET http://h:1/metrics HTTP/1.1\r\n\r\n")),
            want("/metrics")
        );
        assert_eq!(path_of(p(b"\r\nGET / HTTP/1.1\r\n\r\n")), want("/"));
        let Parsed::Head(h) =
            p(b"POST /jobs HTTP/1.1\r\naCcEpT: text/plain \r\nContent-Length: 5\r\n\r\nhello")
        else {
            panic!()
        };
        assert_eq!((h.method.as_str(), h.body_len), ("POST", 5));
        assert_eq!(h.headers[0], ("accept".into(), "text/plain".into()));
    }

    #[test]
    fn an_unfinished_head_waits_and_a_bad_one_is_rejected() {
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
            "GET /jobs/\u{e9} HTTP/1.1\r\n\r\n".as_bytes(),
            b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\n\r\n",
            b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(p(bad), Parsed::Reject(400, _)),
                "{bad:?}: {:?}",
                p(bad)
            );
        }
        assert!(matches!(
            p(b"GET /metrics HTTP/9.9\r\n\r\n"),
            Parsed::Reject(505, _)
        ));
    }

    #[test]
    fn content_length_is_checked_and_capped() {
        let with = |cl: &str| {
            let text = format!("POST /jobs HTTP/1.1\r\nContent-Length: {cl}\r\n\r\n");
            match p(text.as_bytes()) {
                Parsed::Reject(status, _) => status,
                Parsed::Head(_) => 200,
                Parsed::Incomplete => 0,
            }
        };
        for bad in ["-5", "+5", "5 5", "0x10", "", "1e3"] {
            assert_eq!(with(bad), 400, "{bad:?}");
        }
        assert_eq!(with("101"), 413);
        assert_eq!(with("99999999999999999999"), 413);
        assert_eq!(with("100"), 200);
        let two = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(matches!(p(two), Parsed::Reject(400, _)));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(p(chunked), Parsed::Reject(411, _)));
    }

    #[test]
    fn the_caps_cut_a_long_line_and_endless_headers() {
        let long_line = [b"GET /".as_slice(), &[b'a'; 2000]].concat();
        assert_eq!(
            p(&long_line),
            Parsed::Reject(414, "the request line is too long")
        );
        let mut endless = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
        endless.extend(std::iter::repeat_n(b'a', 4000));
        assert_eq!(p(&endless), Parsed::Incomplete);
        endless.extend(std::iter::repeat_n(b'a', 200));
        assert!(matches!(p(&endless), Parsed::Reject(431, _)));
    }
}
