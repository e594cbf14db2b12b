"""Media in and out of the API: data URLs, allowlisted fetches, image and audio decoding, image encoding."""
