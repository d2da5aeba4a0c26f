"""Posting alerts to the webhook whose URL ``ML_ASSETS_ALERT_WEBHOOK_URL`` holds."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

WEBHOOK_VARIABLE = "ML_ASSETS_ALERT_WEBHOOK_URL"


class AlertDeliveryError(RuntimeError):
    pass


def check_webhook_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{WEBHOOK_VARIABLE} must be an http(s) URL; got {parts.scheme or 'no'} scheme")
    return url


def deliver(url: str, payloads: list[dict], timeout: float = 10.0) -> None:
    """POST each payload as JSON; any non-2xx answer or network error raises (the tick retries)."""
    check_webhook_url(url)
    for payload in payloads:
        request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (scheme checked)
                if not 200 <= response.status < 300:
                    raise AlertDeliveryError(f"webhook answered HTTP {response.status}")
        except (urllib.error.URLError, OSError) as exc:
            # The URL may carry a token: name the host only.
            raise AlertDeliveryError(f"webhook at {urlsplit(url).hostname} failed: {exc}") from None
