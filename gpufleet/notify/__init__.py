"""Notifications: lifecycle events and capacity alerts routed by team and kind to Slack, a
signed webhook or e-mail (see docs/notifications.md)."""
