//! Splitting a growing dataset index into samples: complete lines only.
//!
//! The scanner is pure: it takes the bytes read from the file at `cursor.offset` and returns the
//! complete lines in them, what it refused, and the cursor to continue from. Rules:
//!
//! - A line ends at `\n`; a `\r` before it is dropped (CRLF files work). A last line without its
//!   `\n` waits for it: it is not consumed until the newline arrives.
//! - A blank line is not a sample (it still counts in line numbers).
//! - A line longer than the limit is refused with its line number, never truncated; if its end
//!   has not arrived yet, it is skipped until it does, without holding it in memory.
//! - A line that is not UTF-8 is refused with its line number.
//! - In a csv dataset, line 1 is the header: kept for the round files, not a sample.

/// Where scanning continues. Stored with the dataset, so a restart resumes exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Byte offset of the first byte not consumed yet.
    pub offset: u64,
    /// Number (1-based) of the line that starts at `offset`, minus one: lines seen so far.
    pub lines: u64,
    /// Samples produced so far; the next sample gets this sequence number.
    pub samples: u64,
    /// Start offset of an over-long line whose end has not arrived yet.
    pub skipping_from: Option<u64>,
}

/// A sample: one complete line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    pub seq: u64,
    /// 1-based line number in the file.
    pub number: u64,
    /// Byte range of the text (without line end) in the file.
    pub start: u64,
    pub end: u64,
    pub text: &'a str,
}

/// A line that is not a sample, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    TooLong { number: u64, length: u64 },
    NotUtf8 { number: u64 },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooLong { number, length } => write!(f, "line {number} is {length} bytes, over the limit"),
            Refused::NotUtf8 { number } => write!(f, "line {number} is not UTF-8"),
        }
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan<'a> {
    pub samples: Vec<Line<'a>>,
    pub refused: Vec<Refused>,
    /// The csv header, when line 1 was in this read.
    pub header: Option<&'a str>,
    pub cursor: Cursor,
}

/// Scans `buf`, the bytes of the file from `cursor.offset` on.
pub fn scan<'a>(buf: &'a [u8], cursor: Cursor, max_line: usize, csv: bool) -> Scan<'a> {
    let mut out = Scan { cursor, ..Scan::default() };
    let mut pos = 0usize;
    while let Some(newline) = memchr(b'\n', &buf[pos..]) {
        let line_end = pos + newline;
        let number = out.cursor.lines + 1;
        let start = cursor.offset + pos as u64;
        if let Some(from) = out.cursor.skipping_from.take() {
            // Without its `\r`, which is always in the same read as its `\n` (below).
            let cr = u64::from(line_end > pos && buf[line_end - 1] == b'\r');
            let length = start + newline as u64 - from - cr;
            out.refused.push(Refused::TooLong { number, length });
        } else {
            let mut content = &buf[pos..line_end];
            if content.last() == Some(&b'\r') {
                content = &content[..content.len() - 1];
            }
            if content.len() > max_line {
                out.refused.push(Refused::TooLong { number, length: content.len() as u64 });
            } else {
                match std::str::from_utf8(content) {
                    Err(_) => out.refused.push(Refused::NotUtf8 { number }),
                    Ok(text) if csv && number == 1 => out.header = Some(text),
                    Ok(text) if text.trim().is_empty() => {}
                    Ok(text) => {
                        out.samples.push(Line {
                            seq: out.cursor.samples,
                            number,
                            start,
                            end: start + content.len() as u64,
                            text,
                        });
                        out.cursor.samples += 1;
                    }
                }
            }
        }
        out.cursor.lines = number;
        pos = line_end + 1;
    }
    let rest = buf.len() - pos;
    // A last `\r` of a line being skipped waits for its `\n`, so that its length is the same
    // however the file was read.
    let last_cr = usize::from(buf.last() == Some(&b'\r')).min(rest);
    if out.cursor.skipping_from.is_some() {
        pos = buf.len() - last_cr;
    } else if rest > max_line + 1 {
        // Too long already (the +1 leaves room for a `\r`): skip it until its end arrives.
        out.cursor.skipping_from = Some(cursor.offset + pos as u64);
        pos = buf.len() - last_cr;
    }
    out.cursor.offset = cursor.offset + pos as u64;
    out
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|b| *b == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts<'a>(scan: &Scan<'a>) -> Vec<&'a str> {
        scan.samples.iter().map(|l| l.text).collect()
    }

    #[test]
    fn complete_lines_only_and_a_partial_line_waits() {
        let s = scan(b"a\nbb\ncc", Cursor::default(), 100, false);
        assert_eq!(texts(&s), ["a", "bb"]);
        assert_eq!(s.cursor, Cursor { offset: 5, lines: 2, samples: 2, skipping_from: None });
        // The partial line completes on the next read, from the cursor.
        let s = scan(b"cc\nd", s.cursor, 100, false);
        assert_eq!(texts(&s), ["cc"]);
        assert_eq!(s.samples[0], Line { seq: 2, number: 3, start: 5, end: 7, text: "cc" });
        assert_eq!(s.cursor.offset, 8);
    }

    #[test]
    fn crlf_and_blank_lines() {
        let s = scan(b"x,y\r\n\r\n1,2\r\n\n3,4\r\n", Cursor::default(), 100, true);
        assert_eq!(s.header, Some("x,y"));
        assert_eq!(texts(&s), ["1,2", "3,4"]);
        assert_eq!(s.samples[1].number, 5);
        assert_eq!(s.cursor.samples, 2);
        assert_eq!(s.cursor.lines, 5);
    }

    #[test]
    fn the_csv_header_is_only_line_one() {
        let first = scan(b"h1,h2\n", Cursor::default(), 100, true);
        assert_eq!(first.header, Some("h1,h2"));
        assert!(first.samples.is_empty());
        let next = scan(b"1,2\n", first.cursor, 100, true);
        assert_eq!(next.header, None);
        assert_eq!(texts(&next), ["1,2"]);
        assert_eq!(texts(&scan(b"h\n1\n", Cursor::default(), 100, false)), ["h", "1"]);
    }

    #[test]
    fn a_long_line_is_refused_with_its_number_never_truncated() {
        let long = "x".repeat(11);
        let text = format!("ok\n{long}\nfine\n");
        let s = scan(text.as_bytes(), Cursor::default(), 10, false);
        assert_eq!(texts(&s), ["ok", "fine"]);
        assert_eq!(s.refused, [Refused::TooLong { number: 2, length: 11 }]);
        assert_eq!(s.refused[0].to_string(), "line 2 is 11 bytes, over the limit");
        // Exactly at the limit is fine, with or without a \r.
        let at_limit = format!("{}\r\n", "y".repeat(10));
        assert_eq!(scan(at_limit.as_bytes(), Cursor::default(), 10, false).samples.len(), 1);
    }

    #[test]
    fn a_long_line_without_its_end_is_skipped_without_being_held() {
        let s = scan(b"a\nxxxxxxxxxxxxxxxx", Cursor::default(), 10, false);
        assert_eq!(texts(&s), ["a"]);
        assert_eq!(s.cursor.offset, 18, "the long part is consumed");
        assert_eq!(s.cursor.skipping_from, Some(2));
        let s = scan(b"xxxx", s.cursor, 10, false);
        assert_eq!(s.cursor.offset, 22);
        let s = scan(b"xx\nb\n", s.cursor, 10, false);
        assert_eq!(s.refused, [Refused::TooLong { number: 2, length: 22 }]);
        assert_eq!(texts(&s), ["b"]);
        assert_eq!(s.samples[0].number, 3);
        assert_eq!(s.cursor.skipping_from, None);
    }

    #[test]
    fn a_line_that_is_not_utf8_is_refused() {
        let s = scan(b"a\n\xff\xfe\nb\n", Cursor::default(), 10, false);
        assert_eq!(texts(&s), ["a", "b"]);
        assert_eq!(s.refused, [Refused::NotUtf8 { number: 2 }]);
    }

    #[test]
    fn any_split_of_the_input_gives_the_same_samples() {
        let text = b"h1,h2\r\nl1,a\r\n\r\nl2,bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\nl3,c\nl4,d\r\n";
        let whole = scan(text, Cursor::default(), 20, true);
        let expected: Vec<(u64, u64, String)> =
            whole.samples.iter().map(|l| (l.seq, l.number, l.text.to_owned())).collect();
        for cut in 0..text.len() {
            let first = scan(&text[..cut], Cursor::default(), 20, true);
            let mut got: Vec<(u64, u64, String)> =
                first.samples.iter().map(|l| (l.seq, l.number, l.text.to_owned())).collect();
            let mut refused = first.refused.clone();
            let resume = first.cursor.offset as usize;
            let second = scan(&text[resume..], first.cursor, 20, true);
            got.extend(second.samples.iter().map(|l| (l.seq, l.number, l.text.to_owned())));
            refused.extend(second.refused);
            assert_eq!(got, expected, "cut at {cut}");
            assert_eq!(refused.len(), 1, "cut at {cut}: the long line is refused once");
            assert_eq!(second.cursor, whole.cursor, "cut at {cut}");
        }
    }

    // A bounded fuzz: any bytes, read whole or in two reads cut anywhere (the second from the
    // cursor the first returned), give the same samples and refusals: a sample is never
    // counted twice or lost however the file grows. No panic, whatever the bytes.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn lines(scan: &Scan<'_>) -> Vec<(u64, u64, u64, u64, String)> {
            scan.samples.iter().map(|l| (l.seq, l.number, l.start, l.end, l.text.to_owned())).collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn whole_or_in_two_reads_the_same(
                bytes in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b','), Just(0xff), any::<u8>(), b'a'..b'e'], 0..300),
                cut in any::<prop::sample::Index>(),
                max_line in 1usize..40,
                csv in any::<bool>(),
            ) {
                let whole = scan(&bytes, Cursor::default(), max_line, csv);
                let cut = cut.index(bytes.len() + 1);
                let first = scan(&bytes[..cut], Cursor::default(), max_line, csv);
                prop_assert!(first.cursor.offset as usize <= cut);
                let second = scan(&bytes[first.cursor.offset as usize..], first.cursor, max_line, csv);
                let mut both = lines(&first);
                both.extend(lines(&second));
                prop_assert_eq!(lines(&whole), both);
                let mut refused = first.refused.clone();
                refused.extend(second.refused.clone());
                prop_assert_eq!(&whole.refused, &refused);
                prop_assert_eq!(whole.cursor, second.cursor);
                for line in &whole.samples {
                    prop_assert!(!line.text.contains('\n') && line.text.len() <= max_line);
                    prop_assert_eq!(&bytes[line.start as usize..line.end as usize], line.text.as_bytes());
                }
            }
        }
    }
}
