//! A tiny HTTP server that answers every request with a fixed text, flag-compatible with
//! hashicorp/http-echo (`-listen=:5678 -text=hello -status-code=200`). The local Kubernetes maps
//! that image here, so manifests written for real clusters run unchanged.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};

struct Options {
    listen: String,
    text: String,
    status: u16,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut opts = Options {
        listen: ":5678".into(),
        text: String::new(),
        status: 200,
    };
    let env_text = std::env::var("ECHO_TEXT").ok();
    for arg in args {
        let arg = arg.trim_start_matches('-').to_string();
        let (key, value) = arg
            .split_once('=')
            .ok_or_else(|| format!("expected -flag=value, got {arg:?}"))?;
        match key {
            "listen" => opts.listen = value.to_string(),
            "text" => opts.text = value.to_string(),
            "status-code" => opts.status = value.parse().map_err(|_| format!("invalid status code {value:?}"))?,
            other => return Err(format!("unknown flag -{other}")),
        }
    }
    if opts.text.is_empty() {
        opts.text = env_text.ok_or("missing -text")?;
    }
    if opts.listen.starts_with(':') {
        opts.listen = format!("0.0.0.0{}", opts.listen);
    }
    Ok(opts)
}

fn handle(mut stream: TcpStream, opts: &Options) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = if path == "/health" {
        (200, "{\"status\":\"ok\"}\n".to_string())
    } else {
        (opts.status, format!("{}\n", opts.text))
    };
    let response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        if status < 400 { "OK" } else { "Error" },
        body.len()
    );
    stream.write_all(response.as_bytes())
}

fn main() {
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("http-echo: {e}");
            std::process::exit(2);
        }
    };
    let listener = match TcpListener::bind(&opts.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("http-echo: listen on {}: {e}", opts.listen);
            std::process::exit(1);
        }
    };
    println!("http-echo: serving {:?} on {}", opts.text, opts.listen);
    let opts = std::sync::Arc::new(opts);
    for stream in listener.incoming().flatten() {
        let opts = opts.clone();
        std::thread::spawn(move || {
            let _ = handle(stream, &opts);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let o = parse(
            ["-listen=:8080", "-text=hi there", "--status-code=503"]
                .iter()
                .map(|s| s.to_string()),
        )
        .unwrap();
        assert_eq!(
            (o.listen.as_str(), o.text.as_str(), o.status),
            ("0.0.0.0:8080", "hi there", 503)
        );
        assert!(parse(["-bogus=1"].iter().map(|s| s.to_string())).is_err());
    }
}
