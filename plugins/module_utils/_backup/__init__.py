# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Encrypted etcd snapshots: the file format (snapshot.py) and the node's etcdctl steps (etcd.py); see README.md."""
