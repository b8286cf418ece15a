//! `ptrain images`: the image store's images, their size, when last used
//! and by whom.

use ptrain::display::escape;
use ptrain::views::ImageView;

use crate::human::{format_duration, humansize, last_column, terminal_width, truncate};
use crate::{from_bus, parse, print_json, proxy, Failure};

/// `ptrain images`: each image of ptraind's store (yours and others';
/// root sees every user's name, you see yours and a count of the rest).
pub(crate) async fn images(json: bool) -> Result<u8, Failure> {
    let list: Vec<ImageView> = parse(&proxy().await?.images().await.map_err(from_bus)?)?;
    if json {
        print_json(&list);
        return Ok(0);
    }
    if list.is_empty() {
        outln!("no images in ptraind's store");
        return Ok(0);
    }
    let width = terminal_width();
    let reference_width = list
        .iter()
        .map(|i| reference(i).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(9, 60);
    outln!(
        "{:<reference_width$} {:<12} {:>10} {:<14} USERS",
        "REFERENCE",
        "DIGEST",
        "SIZE",
        "LAST USED",
    );
    let now = ptrain::now_micros();
    for image in &list {
        let used = reference_width + 1 + 12 + 1 + 10 + 1 + 14 + 1;
        outln!(
            "{:<reference_width$} {:<12} {:>10} {:<14} {}",
            truncate(&reference(image), reference_width),
            short_digest(&image.digest),
            humansize(image.bytes),
            ago(now, image.last_used),
            last_column(&users(image), used, width)
        );
    }
    Ok(0)
}

/// The reference as shown: ptraind withholds that of an image only other
/// users' jobs used.
fn reference(image: &ImageView) -> String {
    match image.reference.is_empty() {
        true => "(other users')".into(),
        false => escape(&image.reference).into_owned(),
    }
}

/// The digest's first 12 hex digits, as `docker images` shows an id.
fn short_digest(digest: &str) -> String {
    let hex = digest.split_once(':').map_or(digest, |(_, hex)| hex);
    hex.chars().take(12).collect()
}

/// "3h ago", the largest unit only.
fn ago(now: u64, then: u64) -> String {
    if then == 0 {
        return "-".into();
    }
    let secs = now.saturating_sub(then) / 1_000_000;
    let rounded = match secs {
        s if s >= 86_400 => s / 86_400 * 86_400,
        s if s >= 3600 => s / 3600 * 3600,
        s if s >= 60 => s / 60 * 60,
        s => s,
    };
    format!("{} ago", format_duration(rounded * 1_000_000))
}

/// "alice, bob", "alice +2 others", "+1 other".
fn users(image: &ImageView) -> String {
    let mut text = image
        .users
        .iter()
        .map(|u| escape(u))
        .collect::<Vec<_>>()
        .join(", ");
    if image.other_users > 0 {
        if !text.is_empty() {
            text.push(' ');
        }
        let noun = if image.other_users == 1 {
            "other"
        } else {
            "others"
        };
        text.push_str(&format!("+{} {noun}", image.other_users));
    }
    if text.is_empty() {
        "-".into()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_columns_read_as_docker_images_does() {
        assert_eq!(
            short_digest(&format!("sha256:{}", "ab".repeat(32))),
            "abababababab"
        );
        assert_eq!(
            ago(10_000_000_000, 10_000_000_000 - 3_723_000_000),
            "1h ago"
        );
        assert_eq!(ago(10_000_000_000, 10_000_000_000 - 42_000_000), "42s ago");
        assert_eq!(ago(1, 0), "-");
        let mut image = ImageView {
            reference: "r".into(),
            digest: "sha256:00".into(),
            bytes: 1,
            last_used: 1,
            users: vec!["alice".into()],
            other_users: 2,
        };
        assert_eq!(users(&image), "alice +2 others");
        image.users.clear();
        image.other_users = 1;
        assert_eq!(users(&image), "+1 other");
        image.other_users = 0;
        assert_eq!(users(&image), "-");
        assert_eq!(reference(&image), "r");
        image.reference.clear();
        assert_eq!(reference(&image), "(other users')");
    }
}
