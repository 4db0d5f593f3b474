/* dlist -- intrusive doubly-linked lists: a node is any struct with 'prev' and 'next' pointers
 * to its own type, a list the pointer to its first node. */
#ifndef RETRYPROXY_PROXY_DLIST_H
#define RETRYPROXY_PROXY_DLIST_H

/* Puts 'node' first in the list 'head'. */
#define DLIST_PUSH(head, node)                                                                     \
    do {                                                                                           \
        (node)->prev = NULL;                                                                       \
        (node)->next = (head);                                                                     \
        if (head)                                                                                  \
            (head)->prev = (node);                                                                 \
        (head) = (node);                                                                           \
    } while (0)

/* Takes 'node' out of the list 'head' (its own pointers are left as they were). */
#define DLIST_UNLINK(head, node)                                                                   \
    do {                                                                                           \
        if ((node)->prev)                                                                          \
            (node)->prev->next = (node)->next;                                                     \
        else                                                                                       \
            (head) = (node)->next;                                                                 \
        if ((node)->next)                                                                          \
            (node)->next->prev = (node)->prev;                                                     \
    } while (0)

#endif
