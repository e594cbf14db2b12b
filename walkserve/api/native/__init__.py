"""The native route (/v1/generate): any inputs, any output modality, NDJSON events."""
