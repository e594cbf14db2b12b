"""openpi's websocket policy protocol (``openpi_client.WebsocketClientPolicy``), served by the HTTP server."""
