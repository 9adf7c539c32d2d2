"""The dashboard's screens other than the main one."""
