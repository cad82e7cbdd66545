"""gs:// on one native client: libcurl's multi interface driven by the event loop
(`curl`, `curlwatch`), the gs:// reads on it (`backend`), and the choice of client for a store
(`client`)."""
