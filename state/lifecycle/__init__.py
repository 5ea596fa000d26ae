"""The data lifecycle: erasing a user (``erase``) and retention (``retention``)."""
