"""Actions the collector takes when a rule fires: drain requests, notifications, webhooks."""
